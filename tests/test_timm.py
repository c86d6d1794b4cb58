"""timm models under `--dynamo`: the real optimum-cli on timm's own tiny test architectures, given as users give them
(a hub id, here from the offline hub cache, the library inferred as optimum infers it; or a directory with
`--library-name timm`), loaded by optimum's `ORTModelForImageClassification`; logits equal timm's model at a batch
size the capture did not see. Where timm is not installed (T4: its torchvision needs a torch build this machine
does not have), test_flags checks the refusal."""

import pytest
import torch
from optimum.onnxruntime import ORTModelForImageClassification

from optimum_dynamo.manifest import read_manifest
from tiny import cache_snapshot, save_tiny_timm

from conftest import optimum_cli

timm = pytest.importorskip("timm")

ATOL = 1e-4
# timm's own test models, its population of tiny architectures; CI exports a transformer here (convolutional
# networks: a ConvNeXt and a ResNet below), all of them under `slow`
IN_CI = ("test_vit",)
MODELS = [pytest.param(name, marks=() if name in IN_CI else pytest.mark.slow) for name in timm.list_models("test_*")]


def _pixels(model, batch: int = 4) -> torch.Tensor:
    return torch.randn(batch, *model.pretrained_cfg["input_size"], generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("name", MODELS)
def test_a_hub_model_exports_and_its_logits_equal_timm(name, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    repo = f"tiny-timm/{name}"
    saved = save_tiny_timm(name, tmp_path / "saved")
    cache_snapshot(tmp_path / "hf" / "hub", repo, sorted(saved.iterdir()))
    out = tmp_path / "onnx"
    run = optimum_cli("export", "onnx", "--dynamo", "--no-fallback", "--model", repo, out)
    assert run.returncode == 0, run.stderr[-3000:]
    manifest = read_manifest(out)
    assert (manifest["task"], manifest["inputs"], manifest["outputs"]) == ("image-classification", ["pixel_values"],
                                                                           ["logits"])

    expected_model = timm.create_model(f"local-dir:{saved}", pretrained=True).eval()  # the weights of the hub's copy
    pixels = _pixels(expected_model)
    with torch.no_grad():
        expected = expected_model(pixels)
    got = torch.as_tensor(ORTModelForImageClassification.from_pretrained(out)(pixel_values=pixels).logits)
    assert got.shape == expected.shape == (4, 5)
    assert (got - expected).abs().max().item() < ATOL


@pytest.mark.once("t5")
def test_a_directory_exports_with_the_flag_and_from_pretrained(tmp_path):
    """A checkpoint saved by timm in a directory (pytorch_model.bin: the older of timm's two formats): the CLI with
    `--library-name timm`, and `ORTModelForImageClassification.from_pretrained(..., export=True, dynamo=True)`."""
    checkpoint = save_tiny_timm("test_convnext", tmp_path / "checkpoint", safetensors=False)
    before = sorted(p.name for p in checkpoint.iterdir())
    out = tmp_path / "onnx"
    run = optimum_cli("export", "onnx", "--dynamo", "--no-fallback", "--library-name", "timm", "--model", checkpoint, out)
    assert run.returncode == 0, run.stderr[-3000:]
    assert sorted(p.name for p in checkpoint.iterdir()) == before == ["config.json", "pytorch_model.bin"]

    expected_model = timm.create_model(f"local-dir:{checkpoint}", pretrained=True).eval()
    pixels = _pixels(expected_model, batch=5)
    with torch.no_grad():
        expected = expected_model(pixels)
    for model in (ORTModelForImageClassification.from_pretrained(out),
                  ORTModelForImageClassification.from_pretrained(checkpoint, export=True, dynamo=True)):
        got = torch.as_tensor(model(pixel_values=pixels).logits)
        assert (got - expected).abs().max().item() < ATOL


@pytest.mark.once("t5")
def test_hub_options_reach_the_download(tmp_path):
    """`main_export(..., dynamo=True)` with the hub options users pass from Python: a hub id whose files sit in a
    `subfolder`, in the download cache `cache_dir` names (offline: what was downloaded before)."""
    from optimum.exporters.onnx import main_export

    saved = save_tiny_timm("test_resnet", tmp_path / "saved")
    snapshot = cache_snapshot(tmp_path / "cache", "tiny-timm/nested", [])
    (snapshot / "weights").mkdir()
    for file in saved.iterdir():
        (snapshot / "weights" / file.name).write_bytes(file.read_bytes())
    out = tmp_path / "onnx"
    main_export("tiny-timm/nested", out, cache_dir=str(tmp_path / "cache"), subfolder="weights", dynamo=True)
    assert read_manifest(out)["task"] == "image-classification"

    expected_model = timm.create_model(f"local-dir:{saved}", pretrained=True).eval()
    pixels = _pixels(expected_model, batch=3)
    with torch.no_grad():
        expected = expected_model(pixels)
    got = torch.as_tensor(ORTModelForImageClassification.from_pretrained(out)(pixel_values=pixels).logits)
    assert (got - expected).abs().max().item() < ATOL


@pytest.mark.once("t5")
def test_transformers_timm_wrapper_is_exported_as_a_transformers_model(tmp_path):
    """A checkpoint transformers saved for its timm wrapper has timm's config keys, which optimum takes for timm's
    library; it names its transformers class (`architectures`): exported as that class, as before timm's own path."""
    import transformers

    torch.manual_seed(0)
    config = transformers.TimmWrapperConfig(architecture="test_resnet", num_labels=5)
    transformers.TimmWrapperForImageClassification(config).eval().save_pretrained(tmp_path / "checkpoint")
    out = tmp_path / "onnx"
    run = optimum_cli("export", "onnx", "--dynamo", "--no-fallback", "--model", tmp_path / "checkpoint", "--task",
                      "image-classification", out)
    assert run.returncode == 0, run.stderr[-3000:]

    expected_model = transformers.TimmWrapperForImageClassification.from_pretrained(tmp_path / "checkpoint").eval()
    pixels = _pixels(expected_model.timm_model)
    with torch.no_grad():
        expected = expected_model(pixel_values=pixels).logits
    got = torch.as_tensor(ORTModelForImageClassification.from_pretrained(out)(pixel_values=pixels).logits)
    assert (got - expected).abs().max().item() < ATOL
