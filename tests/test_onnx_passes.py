"""The optimizer's passes (`optimum_dynamo.exporters.onnx_passes`), one small graph each: the ops after the
pass, and onnxruntime's outputs before and after."""

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as common_passes
import onnxruntime as ort
import pytest

from optimum_dynamo.exporters.onnx_optimize import optimize, passes, unfused
from optimum_dynamo.exporters.onnx_passes.cache_attention import CacheAttention
from optimum_dynamo.exporters.onnx_passes.onnxscript_optimize import OnnxscriptOptimize
from optimum_dynamo.exporters.onnx_passes.ort_fusions import OrtFusion
from optimum_dynamo.exporters.onnx_passes.pack_matmuls import PackMatmuls
from optimum_dynamo.exporters.onnx_passes.rotary_positions import RotaryAtPositions
from optimum_dynamo.exporters.onnx_passes.shapes import SimplifyShapes
from optimum_dynamo.exporters.onnx_passes.share_input_dims import ShareInputDims
from optimum_dynamo.exporters.onnx_passes.unpack_vocab import WIDE_OUTPUT, UnpackVocab

RNG = np.random.default_rng(0)
FLOAT = ir.DataType.FLOAT


def _input(name, shape, dtype=FLOAT):
    return ir.Value(name=name, shape=ir.Shape(shape), type=ir.TensorType(dtype))


def _model(build, inputs, opset=23):
    """`build(tape, *inputs)` -> outputs: a model of those nodes, shapes inferred."""
    tape = ir.tape.Tape()
    outputs = build(tape, *inputs)
    graph = ir.Graph(inputs, outputs, nodes=tape.nodes, initializers=tape.initializers, opset_imports={"": opset})
    model = ir.Model(graph, ir_version=10)
    common_passes.ShapeInferencePass()(model)
    return model


def _const(tape, array, name):
    return tape.initializer(ir.tensor(np.asarray(array)), name=name)


def _run(model, feed):
    session = ort.InferenceSession(ir.to_proto(model).SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feed)


def _ops(model):
    return [node.op_type for node in model.graph]


def _apply(pass_, model, feed, atol=0.0):
    """Run `pass_` (then dead-code removal), check onnxruntime's outputs, return the model."""
    before = _run(model, feed)
    result = pass_(model)
    assert result.model is model and result.modified
    common_passes.RemoveUnusedNodesPass()(model)
    for expected, got in zip(before, _run(model, feed), strict=True):
        np.testing.assert_allclose(got, expected, atol=atol, rtol=0)
    return model


def test_share_input_dims():
    def build(t, x):
        first, second = t.op("Shape", [x], {"start": 1, "end": 2}), t.op("Shape", [x], {"start": 1, "end": 2})
        return [t.op("Concat", [first, second], {"axis": 0})]

    model = _model(build, [_input("x", ["batch", "sequence"])])
    _apply(ShareInputDims(), model, {"x": np.ones((2, 3), np.float32)})
    assert _ops(model) == ["Shape", "Concat"]


def test_pack_matmuls():
    def build(t, x):
        weights = [_const(t, RNG.standard_normal((4, n), dtype=np.float32), f"w{n}") for n in (5, 6)]
        return [t.op("Relu", [t.op("MatMul", [x, w])]) for w in weights]

    model = _model(build, [_input("x", [2, 3, 4])])
    _apply(PackMatmuls(), model, {"x": RNG.standard_normal((2, 3, 4), dtype=np.float32)}, atol=1e-6)
    assert _ops(model) == ["MatMul", "Split", "Relu", "Relu"]
    assert list(model.graph.initializers) == ["node_MatMul_0_packed_weight", "node_MatMul_0_packed_sizes"]


def test_pack_matmuls_copies_no_weight_before_saving():
    """Export memory: the packed weight is concatenated when read (saved or quantized), and the weights packing
    removed keep no array (the originals are views of the model's weights, alive until validation)."""
    arrays = [RNG.standard_normal((4, n), dtype=np.float32) for n in (3, 2)]
    x = ir.Value(name="x", shape=ir.Shape([1, 4]), type=ir.TensorType(ir.DataType.FLOAT))
    weights = [ir.Value(name=f"w{i}", shape=ir.Shape(a.shape), const_value=ir.tensor(a)) for i, a in enumerate(arrays)]
    nodes = [ir.node("MatMul", [x, w], name=f"m{i}") for i, w in enumerate(weights)]
    uses = [ir.node("Relu", [n.outputs[0]]) for n in nodes]
    graph = ir.Graph([x], [n.outputs[0] for n in uses], nodes=nodes + uses, initializers=weights,
                     opset_imports={"": 23})
    PackMatmuls()(ir.Model(graph, ir_version=10))
    assert all(w.const_value is None for w in weights)
    packed = next(v for v in graph.initializers.values() if v.name.endswith("_packed_weight"))
    assert isinstance(packed.const_value, ir.LazyTensor) and list(packed.const_value.shape) == [4, 5]
    np.testing.assert_array_equal(packed.const_value.numpy(), np.concatenate(arrays, axis=1))


def test_unpack_vocab():
    def build(t, x):
        return [t.op("MatMul", [x, _const(t, RNG.standard_normal((4, WIDE_OUTPUT), dtype=np.float32), "vocab")])]

    model = _model(build, [_input("x", [1, 2, 4])])
    _apply(UnpackVocab(), model, {"x": RNG.standard_normal((1, 2, 4), dtype=np.float32)}, atol=1e-6)
    assert _ops(model) == ["MatMul"] and model.graph.initializers["vocab"].shape == ir.Shape([1, 4, WIDE_OUTPUT])


def test_onnxscript_optimize_keeps_adding_zero():
    """`x * 1` goes, constants fold, `+ 0` stays (an RMSNorm's tiny epsilon is not zero)."""
    def build(t, x):
        one, zero = _const(t, np.float32(1), "one"), _const(t, np.float32(0), "zero")
        folded = t.op("Add", [_const(t, np.float32(2), "two"), _const(t, np.float32(3), "three")])
        return [t.op("Add", [t.op("Add", [t.op("Mul", [x, one]), zero]), folded])]

    model = _model(build, [_input("x", [2, 3])])
    _apply(OnnxscriptOptimize(), model, {"x": RNG.standard_normal((2, 3), dtype=np.float32)})
    assert _ops(model) == ["Add", "Add"]
    assert sorted(v.const_value.numpy().item() for v in model.graph.initializers.values()) == [0.0, 5.0]


def test_onnxscript_optimize_keeps_multiplying_by_almost_one():
    """`x * 1` and `x / 1` go only for an exact 1 (onnxscript's rules also removed `* (1 - 1e-6)`)."""
    def build(t, x):
        one, almost = _const(t, np.float32(1), "one"), _const(t, np.float32(1 - 1e-6), "almost")
        return [t.op("Div", [t.op("Mul", [t.op("Mul", [one, x]), almost]), one])]

    model = _model(build, [_input("x", [2, 3])])
    _apply(OnnxscriptOptimize(), model, {"x": RNG.standard_normal((2, 3), dtype=np.float32)})
    assert _ops(model) == ["Mul"]


def test_simplify_shapes():
    """A dim read back through Reshape -> Transpose -> Shape -> Slice is the dim the Reshape was given."""
    def build(t, x):
        dims = [t.op("Shape", [x], {"start": 0, "end": 1}), t.op("Shape", [x], {"start": 1, "end": 2}),
                _const(t, np.array([2]), "two"), _const(t, np.array([4]), "four")]
        heads = t.op("Transpose", [t.op("Reshape", [x, t.op("Concat", dims, {"axis": 0})], {"allowzero": 1})],
                     {"perm": [0, 2, 1, 3]})
        dim = t.op("Slice", [t.op("Shape", [heads]), _const(t, np.array([1]), "start"), _const(t, np.array([2]), "end")])
        return [heads, dim]

    model = _model(build, [_input("x", ["batch", "sequence", 8])])
    _apply(SimplifyShapes(), model, {"x": RNG.standard_normal((2, 3, 8), dtype=np.float32)})
    assert _ops(model) == ["Shape", "Shape", "Concat", "Reshape", "Transpose", "Identity"]


def _rms_norm(t, x, epsilon):
    mean = t.op("ReduceMean", [t.op("Pow", [x, _const(t, np.float32(2), "two")]), _const(t, np.array([-1]), "axes")],
                {"keepdims": 1, "noop_with_empty_axes": 0})
    normalized = t.op("Mul", [x, t.op("Reciprocal", [t.op("Sqrt", [t.op("Add", [mean, epsilon])])])])
    return [t.op("Mul", [_const(t, RNG.standard_normal(8, dtype=np.float32), "scale"), normalized])]


def test_ort_fusion():
    model = _model(lambda t, x: _rms_norm(t, x, _const(t, np.float32(1e-6), "eps")), [_input("x", [2, 3, 8])])
    _apply(OrtFusion("rms_normalization"), model, {"x": RNG.standard_normal((2, 3, 8), dtype=np.float32)}, atol=1e-5)
    assert _ops(model) == ["SimplifiedLayerNormalization"] and unfused(model) == {}


def test_ort_fusion_says_why_it_did_not_fuse():
    """onnxscript's tracer gives the closest match's failure (here its check: a non-constant epsilon)."""
    model = _model(lambda t, x, eps: _rms_norm(t, x, eps), [_input("x", [2, 3, 8]), _input("eps", [])])
    result = OrtFusion("rms_normalization")(model)
    assert not result.modified and "SimplifiedLayerNormalization" not in _ops(model)
    assert "Epsilon is not a float value" in unfused(model)["rms_normalization"]


HEADS, KV_HEADS, HEAD_DIM = 4, 2, 8


def _attention(t, q, k, v, past_key, past_value, mask):
    key, value = (t.op("Concat", [past, new], {"axis": -2}) for past, new in ((past_key, k), (past_value, v)))
    return [t.op("Attention", [q, key, value, mask]), key, value]


def _attention_inputs(grown=True):
    heads_first = {"q": HEADS, "k": KV_HEADS, "v": KV_HEADS}
    inputs = [_input(n, ["batch", h, "sequence", HEAD_DIM]) for n, h in heads_first.items()]
    if grown:
        inputs += [_input(n, ["batch", KV_HEADS, "past", HEAD_DIM]) for n in ("past_key", "past_value")]
    return [*inputs, _input("mask", ["batch", 1, "sequence", "total"])]


def _attention_feed(batch, sequence, past):
    feed = {n: RNG.standard_normal((batch, h, s, HEAD_DIM), dtype=np.float32) for n, h, s in (
        ("q", HEADS, sequence), ("k", KV_HEADS, sequence), ("v", KV_HEADS, sequence), ("past_key", KV_HEADS, past),
        ("past_value", KV_HEADS, past))}
    keep = np.tril(np.ones((sequence, past + sequence), bool), k=past)[None, None].repeat(batch, 0)
    keep[0, :, :, 0] = False  # the first row is left-padded
    feed["mask"] = np.where(keep, 0, np.finfo(np.float32).min).astype(np.float32)
    return feed


def test_cache_attention():
    """The cache given to ONNX Attention (no Concat), token-major inputs: the same outputs on one new token and on
    two rows continuing by three tokens over a non-empty cache, and on an empty cache."""
    model = _model(_attention, _attention_inputs())
    feeds = [_attention_feed(2, 1, 5), _attention_feed(2, 3, 5), _attention_feed(2, 3, 0)]
    before = [_run(model, feed) for feed in feeds]
    _apply(CacheAttention(), model, feeds[0], atol=1e-5)
    for expected, feed in zip(before, feeds):
        for e, got in zip(expected, _run(model, feed), strict=True):
            np.testing.assert_allclose(got, e, atol=1e-5, rtol=0)
    assert _ops(model) == ["Transpose", "Reshape"] * 3 + ["Attention", "Reshape", "Transpose"]
    attention = next(node for node in model.graph if node.op_type == "Attention")
    assert [v.name for v in attention.inputs[3:]] == ["mask", "past_key", "past_value"]
    assert unfused(model) == {}


def test_cache_attention_says_why_it_did_not_fuse():
    def build(t, q, k, v, mask):
        return [t.op("Attention", [q, k, v, mask])]

    model = _model(build, _attention_inputs(grown=False))
    assert not CacheAttention()(model).modified and _ops(model) == ["Attention"]
    assert unfused(model)["cache_attention"].startswith("attention is not over a grown cache")


def _rotary_over_a_table(t, x, positions):
    """onnxscript's cos/sin-cache fusion without a bound: a table up to the largest position, indexed by the positions."""
    largest = t.op("Add", [t.op("ReduceMax", [positions], {"keepdims": 0}), _const(t, np.int64(1), "one")])
    table = t.op("Range", [_const(t, np.int64(0), "zero"), largest, _const(t, np.int64(1), "step")])
    rows = t.op("Cast", [t.op("Reshape", [table, _const(t, np.array([-1, 1]), "column")])], {"to": FLOAT})
    inv_freq = _const(t, (1.0 / 10000 ** (np.arange(0, HEAD_DIM, 2) / HEAD_DIM)).astype(np.float32)[None], "inv_freq")
    angles = t.op("MatMul", [rows, inv_freq])
    cos, sin = t.op("Cos", [angles]), t.op("Sin", [angles])
    return [t.op("RotaryEmbedding", [x, positions, cos, sin], {"num_heads": HEADS}, domain="com.microsoft")]


def test_rotary_at_positions():
    """cos/sin at the call's positions only, the rotations given their row numbers: the same outputs, bit for bit,
    for decode steps far into the sequence and left-padded rows; no table up to the largest position."""
    model = _model(_rotary_over_a_table, [_input("x", ["batch", "sequence", HEADS * HEAD_DIM]),
                                          _input("positions", ["batch", "sequence"], ir.DataType.INT64)])
    model.opset_imports["com.microsoft"] = 1
    feeds = [{"x": RNG.standard_normal((2, 1, HEADS * HEAD_DIM), dtype=np.float32),
              "positions": np.array([[4095], [4090]])},
             {"x": RNG.standard_normal((2, 4, HEADS * HEAD_DIM), dtype=np.float32),
              "positions": np.array([[0, 1, 2, 3], [1, 1, 0, 1]])}]
    before = [_run(model, feed) for feed in feeds]
    _apply(RotaryAtPositions(), model, feeds[0])
    for expected, feed in zip(before, feeds):
        np.testing.assert_array_equal(_run(model, feed)[0], expected[0])
    assert "ReduceMax" not in _ops(model) and {"Size", "Range", "Cos", "Sin"} <= set(_ops(model))
    assert unfused(model) == {}


def test_rotary_at_positions_says_why_it_did_not_apply():
    model = _model(lambda t, x: [t.op("Cos", [x])], [_input("x", [2])])
    assert not RotaryAtPositions()(model).modified
    assert unfused(model)["rotary_at_positions"] == "cos is not taken of a table Range(0, n) x inv_freq"


def test_levels_and_extra_passes():
    """A level is a list of passes; `extra` passes run after them."""
    names = {level: [type(p).__name__ for p in passes(level)] for level in (None, "O1", "O2", "O3")}
    assert names[None] == names["O1"] == ["OnnxscriptOptimize"]
    assert names["O2"] == ["OnnxscriptOptimize", "SimplifyShapes", "OnnxscriptOptimize", "PackMatmuls", "UnpackVocab"]
    assert {"OrtFusion", "CacheAttention", "ShareInputDims"} <= set(names["O3"])
    seen = []

    class Extra(ir.passes.InPlacePass):
        def call(self, model):
            seen.append(_ops(model))
            return ir.passes.PassResult(model, False)

    model = _model(lambda t, x: [t.op("Mul", [x, _const(t, np.float32(1), "one")])], [_input("x", [2])])
    assert optimize(model, "O1", extra=[Extra()]) is model and seen == [["Identity"]]


@pytest.mark.parametrize("name", ["gelu", "skip_rms_normalization"])
def test_ort_fusion_without_a_candidate_says_so(name):
    model = _model(lambda t, x: [t.op("Relu", [x])], [_input("x", [2])])
    assert not OrtFusion(name)(model).modified and unfused(model) == {name: "no part of the pattern matched"}


def _halves(tape, x, y):
    """x[..., :4] and x[..., 4:] (the pair), y's first half twice and a third slice of x (no pair)."""
    axis, count = _const(tape, [-1], "axis"), iter(range(100))
    half = lambda v, b, e: tape.op("Slice", [v, _const(tape, [b], f"b{next(count)}"), _const(tape, [e], f"e{next(count)}"), axis])  # noqa: E731
    return [tape.op("Add", [half(x, 4, 8), half(x, 0, 4)]), half(x, 2, 6), tape.op("Mul", [half(y, 0, 2), half(y, 0, 2)])]


def test_slices_split_is_onnxscripts_rule_made_linear():
    """The same graph as onnxscript's `slice_split_rule` (bytes of the protos, but for the rule's name the
    rewriter writes in its node's metadata), found through the sliced value's uses instead of a search of the
    whole graph per Slice."""
    from onnxscript import rewriter
    from onnxscript.rewriter.rules.common import slice_split_rule

    from optimum_dynamo.exporters.onnx_passes.slices_split import SlicesSplit

    def build():
        return _model(_halves, [_input("x", [2, "n", 8]), _input("y", [3, 4])])

    feed = {"x": RNG.standard_normal((2, 5, 8)).astype(np.float32), "y": RNG.standard_normal((3, 4)).astype(np.float32)}
    ours = _apply(SlicesSplit(), build(), feed)
    theirs = rewriter.rewrite(build(), pattern_rewrite_rules=[slice_split_rule])
    common_passes.RemoveUnusedNodesPass()(theirs)
    assert _ops(ours) == _ops(theirs) and _ops(ours).count("Split") == 1 and _ops(ours).count("Slice") == 3
    for node in theirs.graph:  # the rewriter tags its nodes with the rule's name (provenance only)
        node.metadata_props.pop("pkg.onnxscript.rewriter.rule_name", None)
    assert ir.to_proto(ours).SerializeToString() == ir.to_proto(theirs).SerializeToString()
