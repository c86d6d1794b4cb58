"""A branch on an image's size that torch.export keeps as a guard: found in the program (`size_guards`), and the
CLI's export of such a model fixed at the configured size (the ONNX graph would take the wrong branch at others)."""

import onnx
import pytest
import torch
import torch.nn.functional as F

import optimum.onnxruntime as ort
from optimum_dynamo.exporters import size_guards

from conftest import optimum_cli

DYNAMIC = {"x": {0: torch.export.Dim.DYNAMIC, 2: torch.export.Dim.DYNAMIC, 3: torch.export.Dim.DYNAMIC}}


class PadsOddWidths(torch.nn.Module):
    def forward(self, x):
        if x.shape[-1] % 4 != 0:  # what Swin / FocalNet's `maybe_pad` does
            x = F.pad(x, (0, 4 - x.shape[-1] % 4))
        return x.mean(dim=(2, 3))


class Pools(torch.nn.Module):
    def forward(self, x):
        return F.adaptive_avg_pool2d(x, 1).flatten(1) + x.shape[-1] // 4  # arithmetic on a size, no branch


def _branches(module, sample):
    program = torch.export.export(module, (), {"x": sample}, dynamic_shapes=DYNAMIC, strict=False)
    return size_guards.branches(program, {"x": (2, 3)}, lambda name, axis, size: True)


def test_a_branch_on_the_width_is_found():
    assert _branches(PadsOddWidths(), torch.randn(2, 3, 8, 16)) == ["Eq(Mod(width, 4), 0) holds at width 16, not at 17"]
    assert _branches(PadsOddWidths(), torch.randn(2, 3, 8, 18)) == ["Ne(Mod(width, 4), 0) holds at width 18, not at 20"]


def test_sizes_without_a_branch_give_none():
    assert _branches(Pools(), torch.randn(2, 3, 8, 16)) == []


def test_a_guard_where_the_model_fails_is_no_branch():
    """Shapes that must agree (GLPN's upsampled map and its skip connection) are guards too; where the model
    itself fails there is no other branch."""
    program = torch.export.export(PadsOddWidths(), (), {"x": torch.randn(2, 3, 8, 16)}, dynamic_shapes=DYNAMIC,
                                  strict=False)
    tried = []
    assert size_guards.branches(program, {"x": (2, 3)}, lambda *probe: tried.append(probe)) == []
    assert tried == [("x", 3, 17)]


@pytest.mark.once("t4")
def test_an_image_size_the_model_branches_on_is_fixed(tmp_path):
    """FocalNet pads an image whose side is not a multiple of its patch: traced at 80 pixels, the graph would not
    pad at 81. The export keeps the configured 64 x 64 (one line says why) and matches PyTorch there at batch 4."""
    import zoo
    from transformers import AutoModelForImageClassification

    torch.manual_seed(0)
    config = zoo.tiny_config("focalnet", dict(zoo.TINY_VISION, image_size=64, hidden_sizes=16, depths=1,
                                               embed_dim=16), stages=True)
    model = AutoModelForImageClassification.from_config(config).eval()
    model.save_pretrained(tmp_path / "checkpoint")
    out = tmp_path / "onnx"
    run = optimum_cli("export", "onnx", "--dynamo", "--no-fallback", "--model", tmp_path / "checkpoint", "--task",
                      "image-classification", out)
    assert run.returncode == 0, run.stderr[-3000:]
    assert ("pixel_values: the image size fixed at 64 x 64, the capture's first (the config's image_size, else 64): "
            "FocalNetForImageClassification branches on it (") in run.stderr
    assert f"Eq(Mod(width, {config.patch_size}), 0) holds at width 80, not at 81" in run.stderr
    dims = onnx.load(out / "model.onnx", load_external_data=False).graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_value or d.dim_param for d in dims][1:] == [3, 64, 64]
    images = torch.randn(4, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(pixel_values=images).logits
    got = ort.ORTModelForImageClassification.from_pretrained(out)(pixel_values=images).logits
    assert (got - expected).abs().max().item() < 1e-4
