"""The migration switch (OPTIMUM_DYNAMO_DEFAULT) and what a default export prints."""

import json
import re
import subprocess
import sys

import pytest
from conftest import optimum_cli

from optimum_dynamo.errors import ExportError
from optimum_dynamo.migration import ENV, dynamo_by_default, use_dynamo

# The lines a default export prints on stderr: our stage lines, the discrepancy table, the result.
OUR_LINES = [
    r"\[\d+/\d+\] [\w .-]+",  # stage lines
    r"    .*",  # stage details ("model: 7 calls recorded", the table's title)
    r"output +max abs +max rel +calls",  # the discrepancy table
    r"\S+ +\d\.\d\de[+-]\d\d +\d\.\d\de[+-]\d\d +\d+",
    r"Exported to .+ \([\w-]+\)",
]


def _exporter(out):
    manifest = out / "optimum_dynamo.json"
    return json.loads(manifest.read_text())["exporter"] if manifest.exists() else "torchscript"


@pytest.mark.parametrize("value, expected", [(None, False), ("", False), ("0", False), ("1", True), ("true", True)])
def test_dynamo_by_default_reads_the_environment(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv(ENV, raising=False)
    else:
        monkeypatch.setenv(ENV, value)
    assert dynamo_by_default() is expected
    assert use_dynamo(None) is expected
    assert use_dynamo(True) is True and use_dynamo(False) is False  # a call's choice wins


def test_invalid_switch_value(monkeypatch, tmp_path, checkpoints):
    monkeypatch.setenv(ENV, "maybe")
    with pytest.raises(ExportError, match=f"invalid {ENV}='maybe'"):
        dynamo_by_default()
    run = optimum_cli("export", "onnx", "--model", checkpoints("llama"), tmp_path / "out")
    assert run.returncode != 0 and "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines()[-1] == f"optimum-cli export onnx --dynamo: error: invalid {ENV}='maybe': expected 1 or 0"
    assert not (tmp_path / "out").exists()


@pytest.mark.once("t4")
def test_switch_makes_plain_cli_export_dynamo_and_prints_only_our_lines(monkeypatch, checkpoints, tmp_path):
    monkeypatch.setenv(ENV, "1")
    out = tmp_path / "out"
    run = optimum_cli("export", "onnx", "--model", checkpoints("llama"), "--task", "text-generation-with-past", out)
    assert run.returncode == 0, run.stderr[-3000:]
    assert _exporter(out) == "dynamo"
    foreign = [line for line in run.stderr.splitlines() if not any(re.fullmatch(p, line) for p in OUR_LINES)]
    assert foreign == []  # no torch.onnx progress, torchvision, LeafSpec or right-padding lines
    assert run.stdout == ""
    # only the stages that have work in this export (no .pt2 stage without --pt2/--aoti)
    stages = ["load model", "capture generation", "infer inputs and dynamic shapes", "torch.export", "translate to ONNX",
              "name inputs and outputs", "optimize", "save", "copy configs and tokenizer", "validate with onnxruntime",
              "write manifest"]
    assert re.findall(r"^\[\d+/(\d+)\] (.+)$", run.stderr, re.M) == [(str(len(stages)), label) for label in stages]


@pytest.mark.once("t5")
def test_no_dynamo_goes_back_to_torchscript(monkeypatch, checkpoints, tmp_path):
    monkeypatch.setenv(ENV, "1")
    out = tmp_path / "out"
    run = optimum_cli("export", "onnx", "--no-dynamo", "--model", checkpoints("llama"),
                      "--task", "text-generation-with-past", out)
    assert run.returncode == 0, run.stderr[-3000:]
    assert (out / "model.onnx").exists() and _exporter(out) == "torchscript"


_FROM_PRETRAINED = """
import json, sys
from optimum.onnxruntime import ORTModelForCausalLM
kwargs = json.loads(sys.argv[2])
model = ORTModelForCausalLM.from_pretrained(sys.argv[1], export=True, **kwargs)
manifest = model.model_save_dir / "optimum_dynamo.json"
print(json.loads(manifest.read_text())["exporter"] if manifest.exists() else "torchscript")
"""


@pytest.mark.once("t4")
@pytest.mark.parametrize("kwargs, expected", [({}, "dynamo"), ({"dynamo": False}, "torchscript")])
def test_switch_makes_from_pretrained_export_dynamo(monkeypatch, checkpoints, kwargs, expected):
    monkeypatch.setenv(ENV, "1")
    run = subprocess.run([sys.executable, "-c", _FROM_PRETRAINED, str(checkpoints("llama")), json.dumps(kwargs)],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().splitlines()[-1] == expected


_MAIN_EXPORT = """
import json, sys
from optimum.exporters.onnx import main_export
main_export(sys.argv[1], sys.argv[2], task="text-generation-with-past", **json.loads(sys.argv[3]))
"""


@pytest.mark.once("t4")
@pytest.mark.parametrize("kwargs, expected", [({}, "dynamo"), ({"dynamo": False}, "torchscript")])
def test_switch_makes_main_export_dynamo(monkeypatch, checkpoints, tmp_path, kwargs, expected):
    """optimum's `main_export` in a fresh process: the switch chooses dynamo, `dynamo=False` goes back."""
    monkeypatch.setenv(ENV, "1")
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, "-c", _MAIN_EXPORT, str(checkpoints("llama")), str(out), json.dumps(kwargs)],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    assert (out / "model.onnx").exists() and _exporter(out) == expected
