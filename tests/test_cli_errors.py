"""Bad input: one clear error line, non-zero exit, no output directory."""

import pytest

from conftest import optimum_cli


def _error_lines(run):
    return [line for line in run.stderr.splitlines() if "error" in line.lower()]


def test_missing_model_dir(tmp_path):
    out = tmp_path / "out"
    run = optimum_cli("export", "onnx", "--dynamo", "--model", tmp_path / "missing", out)
    assert run.returncode != 0
    assert _error_lines(run) == [f"optimum-cli export onnx --dynamo: error: model directory not found: {tmp_path / 'missing'}"]
    assert "Traceback" not in run.stderr
    assert not out.exists()


@pytest.mark.once("t5")  # CI: a refusal of ours, in one environment (make test-all: both)
def test_unknown_task(checkpoints, tmp_path):
    out = tmp_path / "nested" / "out"
    before = sorted(p.name for p in checkpoints("llama").iterdir())
    run = optimum_cli("export", "onnx", "--dynamo", "--model", checkpoints("llama"), "--task", "text-dancing", out)
    assert run.returncode != 0
    lines = _error_lines(run)
    assert len(lines) == 1 and "unknown task 'text-dancing'" in lines[0]
    assert "Traceback" not in run.stderr
    assert not (tmp_path / "nested").exists()
    assert sorted(p.name for p in checkpoints("llama").iterdir()) == before


def test_without_dynamo_the_flag_is_listed_in_help():
    run = optimum_cli("export", "onnx", "--help")
    assert run.returncode == 0 and "--dynamo" in run.stdout


@pytest.mark.once("t5")
def test_decoder_classification_without_a_pad_token(bare_checkpoints, tmp_path):
    """A decoder's sequence classification finds each row's last token by the pad id: a config without one cannot
    run the capture's batches; one line names the option that sets it (no fallback, nothing written)."""
    out = tmp_path / "nested" / "out"
    run = optimum_cli("export", "onnx", "--dynamo", "--model", bare_checkpoints("llama"), "--task",
                      "text-classification", out)
    assert run.returncode != 0
    assert _error_lines(run) == [
        "optimum-cli export onnx --dynamo: error: LlamaForSequenceClassification runs one row at a time without a pad "
        "token, and its config has no pad_token_id: pass --pad_token_id N (the tokenizer's pad or eos id)"]
    assert "Traceback" not in run.stderr
    assert not (tmp_path / "nested").exists()
