"""The translation to ONNX (`exporters.onnx.translate_program`) on small programs."""

import numpy as np
import onnxruntime
import torch

from optimum_dynamo.exporters.onnx import translate_program
from optimum_dynamo.options import ExportOptions


class SqueezeRows(torch.nn.Module):
    def forward(self, x):
        return x.squeeze(1) * 2  # axis 1 is dynamic: traced as not 1, so nothing is squeezed


def test_a_squeeze_that_squeezed_nothing_is_dropped():
    """torch.export keeps `squeeze(1)` of a dynamic axis (a no-op when traced); ONNX's Squeeze would fail at run
    time on that axis: the translation drops it and the graph gives PyTorch's output at an unseen size."""
    rows = torch.export.Dim("rows", min=2)
    program = torch.export.export(SqueezeRows(), (torch.rand(2, 3, 4),), dynamic_shapes=({1: rows},))
    squeezes = [n for n in program.graph.nodes if n.target in (torch.ops.aten.squeeze.dim, torch.ops.aten.squeeze.dims)]
    assert squeezes, "the program should hold the squeeze this test is about"
    model = translate_program(program, ExportOptions.make()).model_proto
    assert "Squeeze" not in {node.op_type for node in model.graph.node}
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.rand(2, 5, 4).astype(np.float32)
    (out,) = session.run(None, {session.get_inputs()[0].name: x})
    np.testing.assert_allclose(out, x * 2, atol=1e-6)


class CheckedScatter(torch.nn.Module):
    """transformers 5's image-token check (`torch_compilable_check` on a tensor, T5Gemma 2's encoder)."""

    def forward(self, x, mask, rows):
        torch._check_tensor_all(mask.sum() * x.shape[-1] == rows.numel())
        return x.masked_scatter(mask.unsqueeze(-1), rows)


def test_a_tensor_check_is_dropped():
    """`torch._check_tensor_all` exports as `_is_all_true`, `.item()` and asserts, which torch.onnx cannot translate:
    the translation drops them (ONNX has no assertion) and the graph gives PyTorch's output."""
    x, mask, rows = torch.rand(1, 4, 3), torch.tensor([[False, True, True, False]]), torch.rand(2, 3)
    program = torch.export.export(CheckedScatter(), (x, mask, rows))
    assert any(n.target is torch.ops.aten._is_all_true.default for n in program.graph.nodes)
    model = translate_program(program, ExportOptions.make()).model_proto
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feed = dict(zip([i.name for i in session.get_inputs()], (x.numpy(), mask.numpy(), rows.numpy())))
    (out,) = session.run(None, feed)
    np.testing.assert_allclose(out, CheckedScatter()(x, mask, rows).numpy(), atol=1e-6)


class ComplementOfMask(torch.nn.Module):
    def forward(self, mask):
        return 1.0 - mask  # XLNet's input mask from an integer attention mask


def test_a_float_minus_integers_is_translated():
    """`1.0 - int_tensor` (aten.rsub.Scalar): torch.onnx's decompositions fail on it; the translation casts the
    integers first and the graph gives PyTorch's float output."""
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    program = torch.export.export(ComplementOfMask(), (mask,))
    assert any(n.target is torch.ops.aten.rsub.Scalar for n in program.graph.nodes)
    model = translate_program(program, ExportOptions.make()).model_proto
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {session.get_inputs()[0].name: mask.numpy()})
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, (1.0 - mask).numpy())
