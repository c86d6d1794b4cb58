"""The aten ops torch.onnx lacks, translated by `exporters.translations`: onnxruntime gives PyTorch's values."""

import onnxruntime as ort
import pytest
import torch

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
