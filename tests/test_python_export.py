"""optimum's Python export functions with `dynamo=True`: `main_export(path, out, dynamo=True)` and
`onnx_export_from_model(model, out, dynamo=True)` (an in-memory model, captured as it is) write the same
files as the CLI and load in the runtime class with parity; without `dynamo=True` they are optimum's."""

import pytest
import torch
from optimum.exporters.onnx import main_export, onnx_export_from_model

import optimum.onnxruntime as ort
from optimum_dynamo.flags import FlagError
from optimum_dynamo.manifest import read_manifest

from conftest import BARE

ATOL = 1e-4
CASES = ["llama", "bert"]


def crossed(*environments):
    """CASES, each in one environment in CI (make test-all: both)."""
    return [pytest.param(m, marks=pytest.mark.once(e)) for m, e in zip(CASES, environments)]


def _files(directory):
    return sorted(p.name for p in directory.iterdir())


def _check(model_type, out, cli_out, torch_model):
    assert _files(out) == _files(cli_out)
    manifest, cli_manifest = read_manifest(out), read_manifest(cli_out)
    assert manifest["exporter"] == "dynamo" and manifest["task"] == cli_manifest["task"]
    assert manifest["inputs"] == cli_manifest["inputs"] and manifest["outputs"] == cli_manifest["outputs"]
    ort_model = getattr(ort, BARE[model_type][1]).from_pretrained(out)
    g = torch.Generator().manual_seed(3)
    inputs = {"input_ids": torch.randint(3, torch_model.config.vocab_size, (4, 7), generator=g),
              "attention_mask": torch.ones(4, 7, dtype=torch.long)}
    inputs["attention_mask"][0, :2] = 0
    with torch.no_grad():
        expected = torch_model(**inputs).logits
    keep = inputs["attention_mask"].bool()
    diff = (ort_model(**inputs).logits - expected)[keep].abs().max().item()
    assert diff < ATOL, f"logits differ by {diff:.3e}"


# CI: each model through each function, in one environment each, crossed
@pytest.mark.parametrize("model_type", crossed("t5", "t4"))
def test_main_export_dynamo(model_type, bare_checkpoints, bare_exports, tmp_path):
    from optimum.exporters.tasks import TasksManager

    checkpoint = bare_checkpoints(model_type)
    main_export(str(checkpoint), tmp_path / "out", task=BARE[model_type][0], dynamo=True)
    task = BARE[model_type][0].removesuffix("-with-past")
    torch_model = TasksManager.get_model_class_for_task(task).from_pretrained(checkpoint).eval()
    _check(model_type, tmp_path / "out", bare_exports(model_type), torch_model)


@pytest.mark.parametrize("model_type", crossed("t4", "t5"))
def test_onnx_export_from_model_dynamo_captures_the_model_as_it_is(model_type, bare_checkpoints, bare_exports, tmp_path):
    """The in-memory model is exported, not a reload of its checkpoint: its changed weights are in the graph."""
    from optimum.exporters.tasks import TasksManager

    task = BARE[model_type][0].removesuffix("-with-past")
    model = TasksManager.get_model_class_for_task(task).from_pretrained(bare_checkpoints(model_type)).eval()
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(1.5)  # differs from the checkpoint on disk
    onnx_export_from_model(model, tmp_path / "out", task=BARE[model_type][0], dynamo=True)
    _check(model_type, tmp_path / "out", bare_exports(model_type), model)


def test_python_keywords_go_through_the_flag_table(bare_checkpoints, tmp_path):
    with pytest.raises(FlagError, match="^--dtype bf16: onnxruntime's CPU provider has no bfloat16 kernels"):
        main_export(str(bare_checkpoints("bert")), tmp_path / "out", task="fill-mask", dtype="bf16", dynamo=True)
    with pytest.raises(FlagError, match="^custom_onnx_configs: OnnxConfigs are torchscript-only"):
        onnx_export_from_model(object(), tmp_path / "out", custom_onnx_configs={"model": None}, dynamo=True)
    assert not (tmp_path / "out").exists()


def test_without_dynamo_main_export_is_optimums(bare_checkpoints, tmp_path):
    """The torchscript exporter runs (no manifest), and every import path sees the same function."""
    import optimum.exporters.onnx.__main__ as main_module
    import optimum.onnxruntime.modeling_decoder as modeling_decoder

    assert main_module.main_export is main_export is modeling_decoder.main_export
    main_export(str(bare_checkpoints("bert")), tmp_path / "out", task="fill-mask", do_validation=False)
    assert (tmp_path / "out" / "model.onnx").exists() and not (tmp_path / "out" / "optimum_dynamo.json").exists()
    ort.ORTModelForMaskedLM.from_pretrained(tmp_path / "out")


@pytest.mark.once("t4")
def test_weights_released_only_when_the_export_loaded_them(checkpoints, tmp_path):
    """Memory: a model the export loads itself is emptied before the onnxruntime session loads its copy; a
    model the caller passes is left as it was (same values after the export)."""
    from transformers import AutoModelForCausalLM

    from optimum_dynamo import export_onnx

    loaded = export_onnx(checkpoints("llama"), tmp_path / "loaded", task="text-generation-with-past")
    assert all(p.numel() == 0 for p in loaded.model.parameters())
    model = AutoModelForCausalLM.from_pretrained(checkpoints("llama")).eval()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    export_onnx(model, tmp_path / "passed", task="text-generation-with-past")
    assert all(torch.equal(before[name], p) for name, p in model.named_parameters())
