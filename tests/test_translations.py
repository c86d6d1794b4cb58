"""The aten ops torch.onnx lacks, translated by `exporters.translations`: onnxruntime gives PyTorch's values."""

import onnxruntime as ort
import pytest
import torch

from optimum_dynamo.exporters.onnx_passes.inverse_dft import WholeSpectrumInverseDFT
from optimum_dynamo.exporters.translations import TABLE


class SearchSorted(torch.nn.Module):
    def __init__(self, **options):
        super().__init__()
        self.options = options

    def forward(self, boundaries, values):
        return torch.searchsorted(boundaries, values, **self.options)


@pytest.mark.parametrize("options, boundaries, values", [
    ({}, torch.tensor([0, 3, 3, 7, 10]), torch.tensor([[3, 5], [-1, 10]])),  # int64, values of any rank
    ({"right": True}, torch.tensor([0, 3, 3, 7, 10]), torch.tensor([3.0, 5.5, 10.0, 11.0])),  # float values
    ({"side": "right"}, torch.tensor([[0.0, 1.5, 2.0], [1.0, 1.0, 4.0]]), torch.tensor([[1.5, 3.0], [1.0, 0.5]])),  # rows
    ({"out_int32": True}, torch.tensor([0, 3, 3, 7, 10]), torch.tensor([3, 11])),
])
def test_searchsorted(tmp_path, options, boundaries, values):
    module = SearchSorted(**options)
    program = torch.onnx.export(torch.export.export(module, (boundaries, values)), dynamo=True,
                                custom_translation_table=TABLE, optimize=False, verbose=False)
    program.save(tmp_path / "model.onnx")
    session = ort.InferenceSession(tmp_path / "model.onnx")
    got = session.run(None, {"boundaries": boundaries.numpy(), "values": values.numpy()})[0]
    expected = module(boundaries, values)
    assert got.dtype == expected.numpy().dtype and got.tolist() == expected.tolist()


class Convolution(torch.nn.Module):
    """MEGA's EMA: a convolution through rfft and irfft of twice the sequence length."""

    def forward(self, x, kernel):
        n = 2 * x.shape[-1]
        return torch.fft.irfft(torch.fft.rfft(x, n=n) * torch.fft.rfft(kernel, n=n), n=n)


def test_irfft_of_any_length(tmp_path):
    """torch.onnx's irfft is one DFT whose output ONNX infers as long as its input (the one-sided spectrum) when the
    length is dynamic: onnxruntime reuses a buffer too short for it ("Shape mismatch attempting to re-use buffer").
    Mended, onnxruntime gives PyTorch's values at lengths other than the traced one (8: radix 2; 18: any other)."""
    module, length = Convolution(), torch.export.Dim("length", min=2)
    generator = torch.Generator().manual_seed(0)
    program = torch.export.export(module, (torch.rand(2, 3, 5), torch.rand(3, 5)),
                                  dynamic_shapes=({2: length}, {1: length}))
    onnx_program = torch.onnx.export(program, dynamo=True, custom_translation_table=TABLE, optimize=False,
                                     verbose=False)
    assert WholeSpectrumInverseDFT()(onnx_program.model).modified
    assert [n.op_type for n in onnx_program.model.graph].count("DFT") == 3  # two rfft, the whole-spectrum one
    onnx_program.save(tmp_path / "model.onnx")
    session = ort.InferenceSession(tmp_path / "model.onnx")
    for n in (4, 9):
        x, kernel = torch.rand(2, 3, n, generator=generator), torch.rand(3, n, generator=generator)
        got = session.run(None, {"x": x.numpy(), "kernel": kernel.numpy()})[0]
        torch.testing.assert_close(torch.from_numpy(got), module(x, kernel), atol=1e-5, rtol=1e-5)


class LastToken(torch.nn.Module):
    """A classifier's row end (transformers 4's older ones): the remainder by the sequence length, a size."""

    def forward(self, ids, scores):
        return (ids - 1) % ids.shape[-1], (scores - 1.5) % scores.shape[-1]


def test_remainder_by_a_size(tmp_path):
    """torch.onnx's remainder by a scalar makes a constant of it, which fails on a symbolic size; translated here,
    onnxruntime gives Python's remainder (the divisor's sign) at another length, for integers and floats."""
    module, length = LastToken(), torch.export.Dim("length", min=2)
    program = torch.export.export(module, (torch.tensor([[0, 3, 5]]), torch.tensor([[-4.0, 0.5, 7.25]])),
                                  dynamic_shapes=({1: length}, {1: length}))
    onnx_program = torch.onnx.export(program, dynamo=True, custom_translation_table=TABLE, optimize=False,
                                     verbose=False)
    onnx_program.save(tmp_path / "model.onnx")
    session = ort.InferenceSession(tmp_path / "model.onnx")
    ids, scores = torch.tensor([[0, 2, 9, -7, 4]]), torch.tensor([[-9.5, -0.25, 3.0, 11.0, 1.5]])
    got = session.run(None, {"ids": ids.numpy(), "scores": scores.numpy()})
    expected = module(ids, scores)
    assert got[0].tolist() == expected[0].tolist()
    torch.testing.assert_close(torch.from_numpy(got[1]), expected[1])


class PyramidPooling(torch.nn.Module):
    def forward(self, x):
        return torch.cat([torch.nn.functional.adaptive_avg_pool2d(x, bins).flatten(2) for bins in (1, 2, 3, 6)], -1)


def test_adaptive_average_pooling_at_any_size(tmp_path):
    """torch's decomposition of adaptive average pooling gathers windows sized at the traced image, which index
    past others; translated here, a graph traced at 16 x 20 gives PyTorch's bins (1e-5) at sizes that divide by none,
    some, or all of the bin counts, and below them."""
    batch, height, width = (torch.export.Dim(n, min=1) for n in ("batch", "height", "width"))
    program = torch.export.export(PyramidPooling(), (torch.randn(2, 4, 16, 20),),
                                  dynamic_shapes=({0: batch, 2: height, 3: width},))
    onnx_program = torch.onnx.export(program, dynamo=True, custom_translation_table=TABLE, optimize=False,
                                     verbose=False)
    onnx_program.save(tmp_path / "model.onnx")
    session = ort.InferenceSession(tmp_path / "model.onnx")
    for size in ((16, 20), (7, 9), (33, 50), (6, 12), (4, 2)):
        x = torch.randn(3, 4, *size)
        got = torch.from_numpy(session.run(None, {"x": x.numpy()})[0])
        torch.testing.assert_close(got, PyramidPooling()(x), atol=1e-5, rtol=1e-5)
