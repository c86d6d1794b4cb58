"""Torchscript fallback when the dynamo export fails, --no-fallback, and the deprecation notice."""

import argparse
import os

import pytest
from optimum.commands.export.onnx import parse_args_onnx
from optimum.onnxruntime import ORTModelForCausalLM
from transformers import AutoModelForCausalLM, AutoTokenizer

from legacy_bridge.torchscript import DEPRECATION
from optimum_dynamo import patches
from optimum_dynamo.integration import add_cli_arguments, run_cli
from optimum_dynamo.manifest import read_manifest
from parity import assert_causal_lm_parity, padded_batch

from conftest import optimum_cli


def _cli_args(*argv):
    """Arguments parsed by optimum's own `export onnx` parser plus ours."""
    parser = argparse.ArgumentParser()
    parse_args_onnx(parser)
    add_cli_arguments(parser)
    return parser.parse_args([str(a) for a in argv])


@pytest.fixture
def dynamo_export_fails():
    """Make the dynamo export of llama fail inside torch.export (patches apply only there)."""

    @patches.register_patch("transformers.models.llama.modeling_llama.LlamaRMSNorm.forward")
    def broken(self, hidden_states):
        raise RuntimeError("broken on purpose")

    yield
    patches.unregister_patch(broken)


def test_failed_dynamo_export_falls_back_to_torchscript(checkpoints, tmp_path, dynamo_export_fails, capsys):
    out = tmp_path / "out"
    run_cli(_cli_args("--dynamo", "--model", checkpoints("llama"), "--task", "text-generation-with-past", out))
    err = capsys.readouterr().err
    assert "falling back to the torchscript exporter" in err and "RuntimeError: broken on purpose" in err
    manifest = read_manifest(out)
    assert manifest["exporter"] == "torchscript-fallback"
    assert manifest["fallback_reason"] == "RuntimeError: broken on purpose"
    ort_model = ORTModelForCausalLM.from_pretrained(out)
    torch_model = AutoModelForCausalLM.from_pretrained(checkpoints("llama")).eval()
    assert_causal_lm_parity(ort_model, torch_model, padded_batch(AutoTokenizer.from_pretrained(out)))


def test_no_fallback_fails_with_one_line_and_no_output(checkpoints, tmp_path, dynamo_export_fails):
    out = tmp_path / "out"
    args = _cli_args("--dynamo", "--no-fallback", "--model", checkpoints("llama"), out)
    with pytest.raises(SystemExit) as exit_info:
        run_cli(args)
    message = str(exit_info.value)
    assert message.startswith("optimum-cli export onnx --dynamo: error: dynamo export failed")
    assert "broken on purpose" in message and "no fallback: --no-fallback" in message and "\n" not in message
    assert not out.exists()


@pytest.mark.parametrize("silenced", [False, True])
def test_torchscript_path_prints_a_deprecation_notice(silenced, checkpoints, tmp_path, monkeypatch):
    monkeypatch.setenv("OPTIMUM_DYNAMO_NO_DEPRECATION", "1" if silenced else "0")
    assert os.environ["OPTIMUM_DYNAMO_NO_DEPRECATION"] == ("1" if silenced else "0")
    run = optimum_cli("export", "onnx", "--model", checkpoints("gpt2"), "--task", "text-generation-with-past",
                      tmp_path / "ts")
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stderr.count(DEPRECATION) == (0 if silenced else 1)
    assert (tmp_path / "ts" / "model.onnx").exists()
