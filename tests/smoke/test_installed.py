"""What a user of the wheel gets: every package in it, activation at start-up without `import optimum_dynamo`,
the opt-out variable, and --dynamo exports that optimum's runtime classes run with PyTorch's greedy tokens
(a state-space model's too: the start-up hook teaches ORTModelForCausalLM its state inputs)."""

import importlib.metadata
import json
import os
import zipfile
from pathlib import Path

import pytest
import torch
from conftest import PROMPTS, SOURCE, greedy, onnx_defines_dynamo, padded, run, tiny, transformers_major


def test_wheel_holds_every_package_of_the_source_tree_and_no_tests():
    wheel = Path(os.environ["SMOKE_WHEEL"])
    names = zipfile.ZipFile(wheel).namelist()
    in_wheel = {str(Path(n).parent) for n in names if n.endswith(".py")}
    in_tree = {str(p.parent.relative_to(SOURCE)) for top in ("optimum_dynamo", "legacy_bridge")
               for p in (SOURCE / top).rglob("*.py") if "__pycache__" not in p.parts and "cli_register" not in p.parts}
    assert in_tree - in_wheel == set()
    assert "optimum/commands/register/register_dynamo.py" in names and "optimum_dynamo_startup.pth" in names
    assert not [n for n in names if n.startswith("tests/") or "cli_register" in n]


def test_start_up_hook_imports_nothing_heavy():
    probe = "import sys; print([m for m in ('torch', 'transformers', 'optimum') if m in sys.modules], " \
            "'optimum_dynamo' in sys.modules)"
    assert run("python", "-c", probe).stdout.split() == ["[]", "True"]
    assert run("python", "-c", probe, env={"OPTIMUM_DYNAMO_DISABLE": "1"}).stdout.split() == ["[]", "False"]


def test_opt_out_leaves_optimum_as_if_the_package_were_not_installed():
    help_text = run("optimum-cli", "export", "onnx", "--help", env={"OPTIMUM_DYNAMO_DISABLE": "1"})
    assert help_text.returncode == 0 and "--no-dynamo" not in help_text.stdout
    assert "optimum-dynamo:" not in help_text.stdout
    # optimum-onnx's main branch (after 0.1.0) has a --dynamo of its own; 0.1.0 has none
    assert ("--dynamo" in help_text.stdout) == onnx_defines_dynamo()
    assert "--dynamo" in run("optimum-cli", "export", "onnx", "--help").stdout
    # With the hook, optimum's runtime imports in both transformers versions; without it, optimum-onnx 0.1.0
    # fails on transformers 5 exactly as it does without this package (its main branch imports there).
    load = "from optimum.onnxruntime import ORTModelForCausalLM; print('ok')"
    assert run("python", "-c", load).stdout.strip() == "ok"
    plain = run("python", "-c", load, env={"OPTIMUM_DYNAMO_DISABLE": "1"})
    if transformers_major() >= 5 and importlib.metadata.version("optimum-onnx") == "0.1.0":
        assert "cannot import name 'get_parameter_dtype'" in plain.stderr
    else:
        assert plain.stdout.strip() == "ok"


# the three kinds of cache the runtime carries: attention (llama), sliding layers (gemma2), state (mamba)
@pytest.mark.parametrize("model_type", ["llama", "gemma2", "mamba"])
def test_cli_export_runs_in_plain_ort_model(model_type, checkpoints, tmp_path):
    from optimum.onnxruntime import ORTModelForCausalLM
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "onnx"
    export = run("optimum-cli", "export", "onnx", "--dynamo", "--model", checkpoints(model_type),
                 "--task", "text-generation-with-past", out)
    assert export.returncode == 0, export.stderr[-3000:]
    assert json.loads((out / "optimum_dynamo.json").read_text())["exporter"] == "dynamo"
    inputs = padded(AutoTokenizer.from_pretrained(out))
    ort_model = ORTModelForCausalLM.from_pretrained(out)
    torch_model = AutoModelForCausalLM.from_pretrained(checkpoints(model_type)).eval()
    assert torch.equal(greedy(ort_model, inputs), greedy(torch_model, inputs))


def test_from_pretrained_export_dynamo(checkpoints):
    from optimum.onnxruntime import ORTModelForCausalLM
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ort_model = ORTModelForCausalLM.from_pretrained(checkpoints("llama"), export=True, dynamo=True)
    manifest = json.loads((Path(ort_model.model_save_dir) / "optimum_dynamo.json").read_text())
    assert manifest["exporter"] == "dynamo"
    inputs = padded(AutoTokenizer.from_pretrained(checkpoints("llama")))
    torch_model = AutoModelForCausalLM.from_pretrained(checkpoints("llama")).eval()
    assert torch.equal(greedy(ort_model, inputs), greedy(torch_model, inputs))


def test_seq2seq_export_runs_in_ort_model_for_seq2seq(checkpoints, tmp_path):
    from optimum.onnxruntime import ORTModelForSeq2SeqLM
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    ckpt, out = checkpoints("t5", "text2text-generation"), tmp_path / "onnx"
    export = run("optimum-cli", "export", "onnx", "--dynamo", "--model", ckpt,
                 "--task", "text2text-generation-with-past", out)
    assert export.returncode == 0, export.stderr[-3000:]
    ort_model = ORTModelForSeq2SeqLM.from_pretrained(out)
    torch_model = AutoModelForSeq2SeqLM.from_pretrained(ckpt).eval()
    tokenizer = AutoTokenizer.from_pretrained(out)
    batch = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask")}
    assert torch.equal(greedy(ort_model, inputs), greedy(torch_model, inputs))



ORT_VLM_TOKENS = """
import json, sys, torch
from optimum_dynamo import ORTModelForImageTextToText
inputs = torch.load(sys.argv[2])
model = ORTModelForImageTextToText.from_pretrained(sys.argv[1])
print(json.dumps(model.generate(**inputs, max_new_tokens=8, min_new_tokens=8, do_sample=False).tolist()))
"""


def test_vlm_export_runs_in_ort_model_for_image_text_to_text(tmp_path):
    """The task inferred from the checkpoint by the real CLI; the user's script imports the runtime class from
    the package (optimum-onnx has none) in its own process: PyTorch's tokens on a left-padded batch of 2."""
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    ckpt, out = tiny.save_tiny_vlm("llava", tmp_path / "llava"), tmp_path / "onnx"
    export = run("optimum-cli", "export", "onnx", "--dynamo", "--model", ckpt, out)
    assert export.returncode == 0, export.stderr[-3000:]
    assert json.loads((out / "optimum_dynamo.json").read_text())["task"] == "image-text-to-text"
    processor = AutoProcessor.from_pretrained(out)
    processor.tokenizer.padding_side = "left"
    images = [Image.new("RGB", (40, 40), color) for color in ("red", "navy")]
    batch = processor(images=images, text=["the <image> fox", "hello <image> world from the lazy dog"],
                      return_tensors="pt", padding=True)
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "pixel_values")}
    assert (inputs["attention_mask"] == 0).any()
    torch.save(inputs, tmp_path / "inputs.pt")
    tokens = run("python", "-c", ORT_VLM_TOKENS, out, tmp_path / "inputs.pt")
    assert tokens.returncode == 0, tokens.stderr[-3000:]
    torch_model = AutoModelForImageTextToText.from_pretrained(ckpt).eval()
    assert json.loads(tokens.stdout.splitlines()[-1]) == greedy(torch_model, inputs).tolist()
