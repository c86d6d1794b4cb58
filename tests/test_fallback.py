"""Torchscript fallback when the dynamo export fails, --no-fallback, and the deprecation notice: all through
optimum's CLI in a fresh interpreter (a fallback decided from state other tests left would prove nothing)."""

import os
import re
import subprocess
import sys

import pytest
import torch
import transformers
from optimum.onnxruntime import ORTModelForCausalLM
from transformers import AutoModelForCausalLM, AutoTokenizer

from legacy_bridge.torchscript import DEPRECATION, has_onnx_config
from optimum_dynamo.manifest import read_manifest
from tiny import save_tiny_decoder, tiny_config, tiny_tokenizer
from parity import assert_causal_lm_parity, padded_batch

from conftest import optimum_cli

# optimum's CLI entry point in a fresh interpreter whose llama RMSNorm is replaced inside torch.export by
# BODY (the patch registry is the one place to break the pipeline from outside; patches apply only in that
# stage, so capture and validation's PyTorch side run the real model).
_PATCHED_CLI = """
import sys
from optimum_dynamo import patches

@patches.register_patch("transformers.models.llama.modeling_llama.LlamaRMSNorm.forward")
def patched(self, hidden_states):
    BODY

from optimum.commands.optimum_cli import main

sys.argv = ["optimum-cli", *sys.argv[1:]]
main()
"""
RAISES = 'raise RuntimeError("broken on purpose")'
WRONG = "return hidden_states * 1.5  # a graph that runs, and is wrong"


def broken_cli(*args, env=None, body=RAISES):
    return subprocess.run([sys.executable, "-c", _PATCHED_CLI.replace("BODY", body), *map(str, args)],
                          capture_output=True, text=True, timeout=900, env={**os.environ, **(env or {})})


def _error_lines(run):
    return [line for line in run.stderr.splitlines() if "error" in line.lower()]


@pytest.mark.once("t5")
def test_failed_dynamo_export_falls_back_to_torchscript(checkpoints, tmp_path):
    """Made the default by the migration switch (no --dynamo): the fallback's own torchscript export must not
    take the dynamo path again."""
    out = tmp_path / "out"
    run = broken_cli("export", "onnx", "--model", checkpoints("llama"), "--task", "text-generation-with-past", out,
                     env={"OPTIMUM_DYNAMO_DEFAULT": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    assert ("optimum-cli export onnx --dynamo: warning: dynamo export failed (RuntimeError: broken on purpose); "
            "falling back to the torchscript exporter (--no-fallback to fail instead)") in run.stderr.splitlines()
    manifest = read_manifest(out)
    assert manifest["exporter"] == "torchscript-fallback"
    assert manifest["fallback_reason"] == "RuntimeError: broken on purpose"
    torch_model = AutoModelForCausalLM.from_pretrained(checkpoints("llama")).eval()
    ort_model = ORTModelForCausalLM.from_pretrained(out)
    assert_causal_lm_parity(ort_model, torch_model, padded_batch(AutoTokenizer.from_pretrained(out)))


@pytest.mark.once("t5")
def test_no_fallback_fails_with_one_line_and_no_output(checkpoints, tmp_path):
    out = tmp_path / "out"
    run = broken_cli("export", "onnx", "--dynamo", "--no-fallback", "--model", checkpoints("llama"), out)
    assert run.returncode != 0
    assert _error_lines(run) == ["optimum-cli export onnx --dynamo: error: dynamo export failed "
                                 "(RuntimeError: broken on purpose); no fallback: --no-fallback"]
    assert "Traceback" not in run.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.once("t5")
def test_verbose_shows_the_traceback_of_the_failed_export(checkpoints, tmp_path):
    """With --verbose, the traceback of a failed dynamo export comes before its one error line (the line is the
    same); without it there is none (above)."""
    out = tmp_path / "out"
    run = broken_cli("export", "onnx", "--dynamo", "--no-fallback", "--verbose", "--model", checkpoints("llama"), out)
    assert run.returncode != 0
    lines = run.stderr.splitlines()
    assert lines[-1] == ("optimum-cli export onnx --dynamo: error: dynamo export failed "
                         "(RuntimeError: broken on purpose); no fallback: --no-fallback")
    start = lines.index("Traceback (most recent call last):")
    assert "RuntimeError: broken on purpose" in lines[start:-1]
    assert not out.exists()


@pytest.mark.parametrize("model_type, covered", [("llama", True), ("deepseek_v3", True), ("qwen3_moe", True),
                                                ("blenderbot-small", True), ("mamba", False)])
def test_fallback_finds_optimum_onnx_config_under_the_model_type_as_spelled(model_type, covered):
    """optimum 2.x keys its registry by the config's model_type (underscores kept): a model type with "_" has
    a torchscript OnnxConfig to fall back on (it was looked up with "-" and never found)."""
    assert has_onnx_config(model_type, "text-generation-with-past") is covered


_GROSS = (r"dynamo export failed \(GrossMismatch: output '[\w.]+' differs from PyTorch by \d\.\d{3}e[+-]\d\d > 0\.01 "
          r"\(call \d+\): the graph is wrong; an explicit --atol above the difference writes it anyway\)")


@pytest.mark.once("t4")
def test_grossly_wrong_graph_is_never_a_success(checkpoints, tmp_path):
    """Validation showing logits off by far more than 1e-2: the torchscript fallback where optimum has an
    OnnxConfig (llama), with the reason in its one warning line; never the wrong graph with exit status 0."""
    out = tmp_path / "out"
    run = broken_cli("export", "onnx", "--dynamo", "--model", checkpoints("llama"), out, body=WRONG)
    assert run.returncode == 0, run.stderr[-3000:]
    warnings = [line for line in run.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1 and re.fullmatch(
        "optimum-cli export onnx --dynamo: warning: " + _GROSS + r"; falling back to the torchscript exporter "
        r"\(--no-fallback to fail instead\)", warnings[0]), warnings
    assert read_manifest(out)["exporter"] == "torchscript-fallback"
    torch_model = AutoModelForCausalLM.from_pretrained(checkpoints("llama")).eval()
    assert_causal_lm_parity(ORTModelForCausalLM.from_pretrained(out), torch_model,
                            padded_batch(AutoTokenizer.from_pretrained(out)))


@pytest.mark.once("t4")
def test_grossly_wrong_graph_without_fallback_exits_non_zero_and_writes_nothing(checkpoints, tmp_path):
    out = tmp_path / "out"
    run = broken_cli("export", "onnx", "--dynamo", "--no-fallback", "--model", checkpoints("llama"), out, body=WRONG)
    assert run.returncode == 1
    assert len(_error_lines(run)) == 1 and re.fullmatch(
        "optimum-cli export onnx --dynamo: error: " + _GROSS + "; no fallback: --no-fallback", _error_lines(run)[0])
    assert list(tmp_path.iterdir()) == []


@pytest.mark.once("t5")
def test_an_explicit_loose_atol_writes_the_graph(checkpoints, tmp_path):
    """The user's own bound decides: a wrong graph within it is written (and its manifest says how wrong)."""
    out = tmp_path / "out"
    run = broken_cli("export", "onnx", "--dynamo", "--atol", "1000", "--model", checkpoints("llama"), out, body=WRONG)
    assert run.returncode == 0, run.stderr[-3000:]
    manifest = read_manifest(out)
    assert manifest["exporter"] == "dynamo"
    assert max(row["max_abs"] for row in manifest["discrepancies"]) > 1e-2


@pytest.mark.once("t5")  # CI: a refusal of ours, in one environment (make test-all: both)
def test_bad_input_never_falls_back(checkpoints, tmp_path):
    """The user's errors (here an unknown task) end the run: no torchscript export is tried."""
    out = tmp_path / "out"
    run = optimum_cli("export", "onnx", "--dynamo", "--model", checkpoints("llama"), "--task", "text-dancing", out)
    assert run.returncode != 0 and "falling back" not in run.stderr
    assert not out.exists()


@pytest.mark.once("t4")
def test_mpt_ends_with_a_working_export(tmp_path):
    """mpt was reported to end with no export on transformers 4 (a capture without past, then a graph that is
    not optimum's): the real CLI must end with a working export, dynamo or the fallback with its reason."""
    ckpt, out = save_tiny_decoder("mpt", tmp_path / "mpt"), tmp_path / "out"
    run = optimum_cli("export", "onnx", "--dynamo", "--model", ckpt, "--task", "text-generation-with-past", out)
    assert run.returncode == 0, run.stderr[-3000:]
    manifest = read_manifest(out)
    assert manifest["exporter"] == "dynamo" or manifest["fallback_reason"], manifest
    torch_model = AutoModelForCausalLM.from_pretrained(ckpt).eval()
    ort_model = ORTModelForCausalLM.from_pretrained(out)
    assert_causal_lm_parity(ort_model, torch_model, padded_batch(AutoTokenizer.from_pretrained(out)))


@pytest.mark.once("t4")
@pytest.mark.parametrize("silenced", [False, True])
def test_torchscript_path_prints_a_deprecation_notice(silenced, checkpoints, tmp_path, monkeypatch):
    monkeypatch.setenv("OPTIMUM_DYNAMO_NO_DEPRECATION", "1" if silenced else "0")
    assert os.environ["OPTIMUM_DYNAMO_NO_DEPRECATION"] == ("1" if silenced else "0")
    run = optimum_cli("export", "onnx", "--model", checkpoints("gpt2"), "--task", "text-generation-with-past",
                      tmp_path / "ts")
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stderr.count(DEPRECATION) == (0 if silenced else 1)
    assert (tmp_path / "ts" / "model.onnx").exists()


@pytest.mark.skipif(transformers.__version__ < "5", reason="CI's time: measured on transformers 5 (metaclip_2)")
def test_a_wrong_fallback_graph_is_never_written(tmp_path):
    """MetaCLIP 2's zero-shot export fails --dynamo's own validation, and optimum's torchscript export of it traces
    the text pooling at its dummy input's eos position (logits 5.0 off PyTorch's, or a Gather out of range, on
    other prompts). The fallback's graph is run on the captured calls: one error line, exit 1, nothing written."""
    checkpoint, out = tmp_path / "checkpoint", tmp_path / "out"
    torch.manual_seed(0)
    transformers.AutoModelForZeroShotImageClassification.from_config(tiny_config("metaclip_2")).save_pretrained(
        checkpoint)
    tiny_tokenizer(128).save_pretrained(checkpoint)
    run = optimum_cli("export", "onnx", "--dynamo", "--model", checkpoint, "--task", "zero-shot-image-classification",
                      out)
    assert run.returncode == 1, run.stderr[-3000:]
    (line,) = _error_lines(run)
    assert re.fullmatch(r"optimum-cli export onnx --dynamo: error: " + _GROSS + r"; the torchscript fallback's graph "
                        r"(differs from PyTorch by [\d.e+-]+ > 0\.01 on the captured inputs \([\w.]+\)|fails on the "
                        r"captured inputs \(.+\)): the graph is wrong, nothing written", line), line
    assert not out.exists()
