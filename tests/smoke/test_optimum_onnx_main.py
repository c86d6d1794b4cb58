"""`optimum-cli export onnx` and `main_export` beside an optimum-onnx that may define its own `--dynamo` (its main
branch after 0.1.0: environment T4main) or not (0.1.0: T4, T5): one `--dynamo` option, `--no-dynamo`, the plain
export left to optimum-onnx, `main_export(..., dynamo=True)`, optimum-onnx's own dynamo exporter under the
opt-out, and the fallback to the torchscript exporter."""

import json
import re

import pytest
import torch
from conftest import greedy, onnx_defines_dynamo, padded, run, transformers_major

TASK = ("--task", "text-generation-with-past")
DISABLE = {"OPTIMUM_DYNAMO_DISABLE": "1"}
ON_TRANSFORMERS_5 = transformers_major() >= 5
# Without this package optimum-onnx exports nothing on transformers 5 (0.1.0 does not import there; main imports
# and fails in its mask functions: `sdpa_mask_without_vmap() missing 1 required positional argument: 'cache_position'`).
ALONE_ON_TRANSFORMERS_5 = "optimum-onnx alone does not export on transformers 5"


def _option_strings(help_text: str) -> list[str]:
    """Every option string of argparse's option lists (entry lines such as `  -v, --verbose  With ...`)."""
    found = []
    for line in help_text.splitlines():
        entry = re.match(r"  (-\S.*?)(?:\s{2,}|$)", line)
        if entry:
            found += [part.split()[0] for part in entry.group(1).split(", ")]
    return found


def _files(directory) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())


def _export(*argv, env=None):
    return run("optimum-cli", "export", "onnx", *map(str, argv), env=env)


def test_help_lists_dynamo_once_and_no_dynamo():
    result = _export("--help")
    assert result.returncode == 0, result.stderr[-3000:]
    options = _option_strings(result.stdout)
    assert options.count("--dynamo") == 1, options
    assert options.count("--no-dynamo") == 1, options
    usage = result.stdout.split("\n\n")[0]
    assert len(re.findall(r"(?<![\w-])--dynamo(?![\w-])", usage)) == 1, usage


@pytest.mark.skipif(ON_TRANSFORMERS_5, reason=ALONE_ON_TRANSFORMERS_5)
def test_plain_export_writes_what_optimum_onnx_alone_writes(checkpoints, tmp_path):
    ckpt = checkpoints("llama")
    ours = _export("--model", ckpt, *TASK, tmp_path / "ours")
    assert ours.returncode == 0, ours.stderr[-3000:]
    alone = _export("--model", ckpt, *TASK, tmp_path / "alone", env=DISABLE)
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert _files(tmp_path / "ours") == _files(tmp_path / "alone")
    assert "model.onnx" in _files(tmp_path / "ours")
    assert "optimum_dynamo.json" not in _files(tmp_path / "ours")


def test_no_dynamo_writes_a_torchscript_export_ort_model_loads(checkpoints, tmp_path):
    from optimum.onnxruntime import ORTModelForCausalLM
    from transformers import AutoTokenizer

    out = tmp_path / "onnx"
    export = _export("--no-dynamo", "--model", checkpoints("llama"), *TASK, out)
    assert export.returncode == 0, export.stderr[-3000:]
    assert (out / "model.onnx").exists() and not (out / "optimum_dynamo.json").exists()
    ort_model = ORTModelForCausalLM.from_pretrained(out)
    inputs = padded(AutoTokenizer.from_pretrained(out))
    assert greedy(ort_model, inputs).shape == (2, inputs["input_ids"].shape[1] + 8)


def test_main_export_dynamo_keyword_gives_pytorch_greedy_tokens(checkpoints, tmp_path):
    from optimum.onnxruntime import ORTModelForCausalLM
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ckpt, out = checkpoints("llama"), tmp_path / "onnx"
    code = ("import sys; from optimum.exporters.onnx import main_export; "
            "main_export(sys.argv[1], sys.argv[2], task='text-generation-with-past', dynamo=True)")
    export = run("python", "-c", code, ckpt, out)
    assert export.returncode == 0, export.stderr[-3000:]
    assert json.loads((out / "optimum_dynamo.json").read_text())["exporter"] == "dynamo"
    inputs = padded(AutoTokenizer.from_pretrained(out))
    ort_model = ORTModelForCausalLM.from_pretrained(out)
    torch_model = AutoModelForCausalLM.from_pretrained(ckpt).eval()
    assert torch.equal(greedy(ort_model, inputs), greedy(torch_model, inputs))


@pytest.mark.skipif(not onnx_defines_dynamo(), reason="this optimum-onnx has no --dynamo of its own (0.1.0)")
@pytest.mark.skipif(ON_TRANSFORMERS_5, reason=ALONE_ON_TRANSFORMERS_5)
def test_opt_out_dynamo_runs_optimum_onnx_own_dynamo_exporter(checkpoints, tmp_path):
    out = tmp_path / "onnx"
    export = _export("--dynamo", "--model", checkpoints("llama"), *TASK, out, env=DISABLE)
    assert export.returncode == 0, export.stderr[-3000:]
    assert (out / "model.onnx").exists() and not (out / "optimum_dynamo.json").exists()


# A model --dynamo cannot export today and optimum-onnx's OnnxConfig can, per transformers version (when a fix
# makes it export, this test needs another one; the zoo's "fallback" rows list them). transformers 4: bigbird_pegasus'
# decoder adds its causal mask to scores one position longer than the cache (RuntimeError: the size of tensor a (s70)
# must match the size of tensor b (s70 + 1)). transformers 5: mpt's attention bias, sliced to the cache length, does
# not match the scores' length (RuntimeError: the size of tensor a (s70) must match the size of tensor b
# (1 - Max(0, -2*s70 - s87 + 1))); transformers 4's mpt exports.
FALLS_BACK = ("mpt", "text-generation") if ON_TRANSFORMERS_5 else ("bigbird_pegasus", "text2text-generation")


def test_a_model_dynamo_cannot_export_falls_back_to_torchscript(checkpoints, tmp_path):
    out = tmp_path / "onnx"
    model_type, task = FALLS_BACK
    export = _export("--dynamo", "--model", checkpoints(model_type, task), "--task", f"{task}-with-past", out)
    assert export.returncode == 0, export.stderr[-3000:]
    if json.loads((out / "optimum_dynamo.json").read_text())["exporter"] == "dynamo":  # validated, tokens included
        pytest.skip(f"{model_type} exports with --dynamo on this transformers (mpt on 5.0): nothing falls back")
    warnings = [line for line in export.stderr.splitlines()
                if "warning:" in line and "falling back to the torchscript exporter" in line]
    assert len(warnings) == 1, export.stderr[-3000:]
    assert "def forward(" not in export.stderr  # torch's partial FX graph is not printed (only with -v)
    assert (out / ("model.onnx" if task == "text-generation" else "encoder_model.onnx")).exists()
    assert json.loads((out / "optimum_dynamo.json").read_text())["exporter"] == "torchscript-fallback"
