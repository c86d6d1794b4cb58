"""Graphs holding the same weights read them from one external-data file (`exporters/shared_weights.py`): each
distinct tensor stored once, the graphs' results unchanged."""

import numpy as np
import onnx_ir as ir
import onnxruntime as ort

from optimum_dynamo.exporters.shared_weights import ALIGNMENT, share_weights


def _graph(weight: np.ndarray, bias: np.ndarray, name: str) -> ir.Model:
    """y = x @ weight + bias, both initializers stored outside the graph when saved."""
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2, weight.shape[0]]))
    w = ir.Value(name=f"{name}.weight", const_value=ir.tensor(weight, name=f"{name}.weight"))
    b = ir.Value(name="bias", const_value=ir.tensor(bias, name="bias"))
    product = ir.node("MatMul", [x, w], outputs=[ir.Value(name="product")])
    out = ir.node("Add", [product.outputs[0], b], outputs=[ir.Value(name="y", type=ir.TensorType(ir.DataType.FLOAT))])
    graph = ir.Graph([x], out.outputs, nodes=[product, out], initializers=[w, b], opset_imports={"": 21})
    return ir.Model(graph, ir_version=10)


def _run(path, x):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_graphs_share_one_copy_of_their_common_weights(tmp_path):
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((64, 64), dtype=np.float32)
    biases = [rng.standard_normal(64, dtype=np.float32) for _ in range(2)]
    x = rng.standard_normal((2, 64), dtype=np.float32)
    names = ["first.onnx", "second.onnx"]
    for file, bias, prefix in zip(names, biases, ("a", "b")):  # the same weight under two names, two biases
        ir.save(_graph(weight, bias, prefix), tmp_path / file, external_data=f"{file}_data", size_threshold_bytes=0)
    expected = [_run(tmp_path / file, x) for file in names]

    written = share_weights(tmp_path, names, "weights.onnx_data")

    assert sorted(p.name for p in tmp_path.iterdir()) == ["first.onnx", "second.onnx", "weights.onnx_data"]
    sizes = [weight.nbytes, biases[0].nbytes, biases[1].nbytes]  # the weight once, each bias
    assert written == (tmp_path / "weights.onnx_data").stat().st_size
    assert written == sum(-(-size // ALIGNMENT) * ALIGNMENT for size in sizes[:-1]) + sizes[-1]
    for file, before in zip(names, expected):
        np.testing.assert_array_equal(_run(tmp_path / file, x), before)
