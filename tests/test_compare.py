"""Both exporters on one model, each measured against PyTorch (optimum_dynamo.compare)."""

import subprocess
import sys

import pytest

from optimum_dynamo.compare import compare_exporters, table


@pytest.mark.once("t4")
def test_compare_command_on_llama(checkpoints):
    run = subprocess.run([sys.executable, "-m", "optimum_dynamo.compare", "--model", str(checkpoints("llama")),
                          "--task", "text-generation-with-past"], capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [line.split() for line in run.stdout.splitlines() if line.startswith(("torchscript ", "dynamo "))]
    assert [r[0] for r in rows] == ["torchscript", "dynamo"], run.stdout
    for r in rows:
        first, later, tokens, status = float(r[3]), float(r[4]), r[5], r[6]
        assert first < 1e-4 and later < 1e-4 and tokens == "equal" and status == "ok", run.stdout


@pytest.mark.slow
def test_compare_function_on_gpt2(checkpoints, tmp_path):
    rows = compare_exporters(checkpoints("gpt2"), "text-generation-with-past", output=tmp_path)
    print(table(rows))
    assert [r.exporter for r in rows] == ["torchscript", "dynamo"]
    for r in rows:
        assert r.status == "ok" and r.tokens_equal and r.first_step < 1e-4 and r.later_steps < 1e-4, table(rows)
    assert (tmp_path / "dynamo" / "optimum_dynamo.json").exists() and (tmp_path / "torchscript" / "model.onnx").exists()
