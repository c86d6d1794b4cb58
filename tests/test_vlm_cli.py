"""`optimum-cli export onnx --dynamo --task image-text-to-text` (the real CLI, in a subprocess) on tiny Gemma3
and LLaVA checkpoints: the four component graphs, one manifest on top, the config, generation config and
processor beside them; the task inferred when --task is omitted; the exported graphs give PyTorch's greedy
tokens through `ORTModelForImageTextToText`; options it cannot honour, a checkpoint without processor files and the export
without --dynamo are one error line, exit status 1 and nothing written."""

import importlib.util
import json
import re

import pytest
import torch
import transformers
from transformers import AutoModelForImageTextToText, AutoProcessor

from optimum_dynamo import ORTModelForImageTextToText
from optimum_dynamo.exporters.vision_language import default_image, processor_inputs
from optimum_dynamo.manifest import read_manifest
from tiny import save_tiny_vlm

from conftest import optimum_cli

TASK = "image-text-to-text"
PROG = "optimum-cli export onnx --dynamo"
COMPONENTS = ["vision_encoder", "multi_modal_projector", "embed_tokens", "decoder_model"]
CALLS = {"vision_encoder": 1, "multi_modal_projector": 1, "embed_tokens": 4, "decoder_model": 4}
MODEL_FILES = {"config.json", "generation_config.json", "model.safetensors"}
PAST = [f"past_key_values.{i}.{kv}" for i in range(2) for kv in ("key", "value")]
MANIFEST_KEYS = ["backend", "components", "discrepancies", "dtype", "exporter", "files", "model", "optimize_level",
                 "runtime", "task", "timings_s", "versions"]
RECORD_KEYS = ["calls_recorded", "contrib_ops", "discrepancies", "dynamic_axes", "files", "inputs", "outputs",
               "sample_call", "static_axes", "unfused"]
# model type -> the CLI's arguments besides --model and OUT: Gemma3's task is inferred, LLaVA's given (with O2)
ARGS = {"gemma3": ["--atol", "1e-4"], "llava": ["--task", TASK, "--atol", "1e-4", "--optimize", "O2"]}
# CI: each in one environment (make test-all: both); test_vlm.py exports both families in both, from Python
ROWS = [pytest.param("gemma3", marks=pytest.mark.once("t4")), pytest.param("llava", marks=pytest.mark.once("t5"))]
NEW_TOKENS = 8


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("vlm-ckpt")
    made = {model_type: save_tiny_vlm(model_type, root / model_type) for model_type in ARGS}
    made["bare"] = save_tiny_vlm("llava", root / "bare", bare=True)
    return made


@pytest.fixture(scope="module")
def exported(checkpoints, tmp_path_factory):
    root, made = tmp_path_factory.mktemp("vlm-onnx"), {}

    def get(model_type):
        if model_type not in made:
            out = root / model_type
            run = optimum_cli("export", "onnx", "--dynamo", "--model", checkpoints[model_type], *ARGS[model_type], out)
            assert run.returncode == 0, run.stderr[-3000:]
            made[model_type] = out
        return made[model_type]

    return get


def _error_lines(run):
    return [line for line in run.stderr.splitlines() if "error" in line.lower()]


@pytest.mark.parametrize("model_type", ROWS)
def test_components_and_one_manifest(model_type, checkpoints, exported):
    ckpt, out = checkpoints[model_type], exported(model_type)
    processor_files = {p.name for p in ckpt.iterdir()} - MODEL_FILES
    assert processor_files  # the checkpoint's processor (tokenizer, image processor) travels with the graphs
    files = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}
    graphs = {f"{name}/model.{ext}" for name in COMPONENTS for ext in ("onnx", "onnx_data")}
    assert files == graphs | {"config.json", "generation_config.json", "vlm.json", "optimum_dynamo.json"} | processor_files

    manifest = read_manifest(out)
    assert sorted(manifest) == MANIFEST_KEYS
    assert (manifest["exporter"], manifest["task"], manifest["runtime"], manifest["dtype"]) == (
        "dynamo", TASK, "optimum_dynamo.ORTModelForImageTextToText", "fp32")
    assert manifest["optimize_level"] == ("O2" if model_type == "llava" else None)
    assert list(manifest["components"]) == COMPONENTS
    assert manifest["files"] == [f"{name}/model.{ext}" for name in COMPONENTS for ext in ("onnx", "onnx_data")]
    for name, record in manifest["components"].items():
        assert sorted(record) == RECORD_KEYS, name
        assert record["files"] == [f"{name}/model.onnx", f"{name}/model.onnx_data"]
        assert record["calls_recorded"] == CALLS[name], name
        assert max(row["max_abs"] for row in record["discrepancies"]) < 1e-4, name
    assert {row["component"] for row in manifest["discrepancies"]} == set(COMPONENTS)
    records = manifest["components"]
    token_types = ["token_type_ids"] if model_type == "gemma3" else []
    assert records["decoder_model"]["inputs"] == ["inputs_embeds", "attention_mask", "position_ids", *PAST, *token_types]
    assert records["decoder_model"]["outputs"] == ["logits", *[n.replace("past_key_values", "present") for n in PAST]]
    assert records["vision_encoder"]["inputs"] == ["pixel_values"]
    assert [records[name]["outputs"] for name in ("multi_modal_projector", "embed_tokens")] == [["output"], ["output"]]
    assert json.loads((out / "vlm.json").read_text())["components"] == {n: f"{n}/model.onnx" for n in COMPONENTS}

    saved = AutoProcessor.from_pretrained(out)
    assert type(saved) is type(AutoProcessor.from_pretrained(ckpt))
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == 2


@pytest.mark.parametrize("model_type", ROWS)
def test_greedy_tokens_equal_pytorch(model_type, checkpoints, exported):
    ckpt, out = checkpoints[model_type], exported(model_type)
    model = AutoModelForImageTextToText.from_pretrained(ckpt).eval()
    processor = AutoProcessor.from_pretrained(out)
    placeholder = getattr(processor, "boi_token", None) or processor.image_token
    inputs = processor_inputs(model, processor, default_image(seed=7), f"hello world {placeholder} from the lazy dog")
    with torch.no_grad():
        expected = model.generate(**inputs, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
        tokens = ORTModelForImageTextToText.from_pretrained(out).generate(
            **inputs, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
    assert tokens.tolist() == expected.tolist()


@pytest.mark.once("t4")
def test_main_export_from_python(checkpoints, exported, tmp_path):
    from optimum.exporters.onnx import main_export

    main_export(checkpoints["gemma3"], tmp_path / "out", task=TASK, dynamo=True)
    manifest, cli = read_manifest(tmp_path / "out"), read_manifest(exported("gemma3"))
    assert manifest["task"] == TASK and manifest["files"] == cli["files"]
    assert {n: r["inputs"] for n, r in manifest["components"].items()} == {
        n: r["inputs"] for n, r in cli["components"].items()}


# arguments -> the one error line (without the program's prefix)
REFUSED = {
    ("--quantize", "int8"): f"--quantize int8 with --task {TASK}: not supported for component exports yet; drop it "
                            "(optimum-cli onnxruntime quantize quantizes a graph afterwards)",
    ("--dtype", "fp16"): f"--dtype fp16 with --task {TASK}: the components are exported in fp32 only yet; drop --dtype",
    ("--pt2",): f"--pt2 with --task {TASK}: not supported for component exports yet; drop it",
    ("--optimize", "O3"): f"--optimize O3 with --task {TASK}: its fusions are for text decoders; use O1 or O2",
}


# CI: each in one environment (the refusal is ours; make test-all: both)
@pytest.mark.parametrize("args", [pytest.param(args, marks=pytest.mark.once("t4" if i % 2 else "t5"))
                                  for i, args in enumerate(REFUSED)], ids=" ".join)
def test_option_it_cannot_honour_is_refused(args, checkpoints, tmp_path):
    out = tmp_path / "nested" / "out"
    run = optimum_cli("export", "onnx", "--dynamo", "--model", checkpoints["llava"], "--task", TASK, *args, out)
    assert run.returncode == 1
    assert _error_lines(run) == [f"{PROG}: error: {REFUSED[args]}"]
    assert "Traceback" not in run.stderr and not (tmp_path / "nested").exists()


@pytest.mark.once("t5")  # CI: a refusal of ours, in one environment (make test-all: both)
def test_checkpoint_without_processor_files_is_refused(checkpoints, tmp_path):
    bare, out = checkpoints["bare"], tmp_path / "out"
    before = sorted(p.name for p in bare.iterdir())
    run = optimum_cli("export", "onnx", "--dynamo", "--model", bare, out)  # the task is inferred, then refused
    assert run.returncode == 1
    assert _error_lines(run) == [
        f"{PROG}: error: cannot load LlavaProcessor from {bare} (OSError): image-text-to-text exports run the model "
        "on an image and a prompt, which need the checkpoint's processor files (tokenizer and image processor); "
        "save them beside the model (LlavaProcessor.save_pretrained)"]
    assert not out.exists() and sorted(p.name for p in bare.iterdir()) == before


@pytest.mark.skipif(transformers.__version__ < "5", reason="transformers 4.57 cannot read phi4_multimodal's config back")
def test_a_causal_lm_taking_images_is_sent_to_its_own_task(tmp_path):
    """phi4_multimodal (images and audio into a causal LM) is in transformers' causal-LM mapping, not the
    image-text-to-text one: refused before anything loads, naming the task its class serves (the zoo exports it
    so)."""
    from transformers import AutoConfig

    ckpt, out = tmp_path / "phi4", tmp_path / "out"
    AutoConfig.for_model("phi4_multimodal").save_pretrained(ckpt)  # the config alone: refused before the weights
    run = optimum_cli("export", "onnx", "--dynamo", "--model", ckpt, "--task", TASK, out)
    assert run.returncode == 1
    assert _error_lines(run) == [
        f"{PROG}: error: phi4_multimodal is not in transformers' image-text-to-text mapping: its model class is a "
        "causal LM, export it with --task text-generation-with-past"]
    assert not out.exists() and sorted(p.name for p in ckpt.iterdir()) == ["config.json"]


@pytest.mark.skipif(importlib.util.find_spec("torchvision") is not None,
                    reason="the refusal is for environments without torchvision (T4: it does not load on torch 2.13)")
def test_processor_needing_torchvision_is_refused_naming_it(tmp_path):
    """InternVL's processor declares a video processor; without torchvision (these environments) transformers
    cannot build it: one line that says so."""
    ckpt, out = save_tiny_vlm("internvl", tmp_path / "internvl"), tmp_path / "out"
    run = optimum_cli("export", "onnx", "--dynamo", "--model", ckpt, out)
    assert run.returncode == 1
    (line,) = _error_lines(run)
    assert re.fullmatch(rf"{PROG}: error: cannot load InternVLProcessor from {ckpt} \(([\w ]+)\): it declares a video "
                        "processor, and transformers' video processors need torchvision, which is not installed "
                        r"\(pip install torchvision\)", line), line
    assert not out.exists()


@pytest.mark.once("t5")
def test_atol_is_honoured(checkpoints, tmp_path):
    out = tmp_path / "out"
    run = optimum_cli("export", "onnx", "--dynamo", "--model", checkpoints["llava"], "--atol", "1e-12", out)
    assert run.returncode == 1
    (line,) = _error_lines(run)
    assert re.fullmatch(rf"{PROG}: error: vision_encoder: output '[\w.]+' differs from PyTorch by .* > atol 1e-12.*",
                        line), line
    assert not out.exists()


@pytest.mark.once("t5")
def test_without_dynamo_one_line_suggests_it(checkpoints, tmp_path):
    out = tmp_path / "out"
    run = optimum_cli("export", "onnx", "--model", checkpoints["llava"], "--task", TASK, out)
    assert run.returncode == 1
    # (transformers 4.57's env also prints torch's warnings about torchao's enums, as any torchscript export does)
    assert [line for line in run.stderr.splitlines() if ": error:" in line] == [f"optimum-cli export onnx: error: --task {TASK}: the torchscript exporter has no "
                                 "export for this task (no OnnxConfig of any model); add --dynamo"]
    assert "Traceback" not in run.stderr and not out.exists()
