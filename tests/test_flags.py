"""optimum's export options under --dynamo: every option has a row in the flag table; refused options
give one error line, a non-zero exit and no output; honoured ones show their effect in the output."""

import importlib.util
import inspect
import json
from pathlib import Path

import onnx
import pytest

from optimum_dynamo import flags
from optimum_dynamo.manifest import read_manifest

from conftest import optimum_cli


def test_every_option_of_optimums_parser_has_a_row():
    missing = sorted(set(flags.cli_defaults()) - set(flags.FLAGS))
    assert missing == [], f"options of `optimum-cli export onnx` without a row in optimum_dynamo/flags.py: {missing}"


@pytest.mark.parametrize("name", ["main_export", "onnx_export_from_model"])
def test_every_keyword_of_optimums_export_functions_has_a_row(name):
    import optimum.exporters.onnx as exporters

    function = getattr(exporters, name)
    assert getattr(function, "_optimum_dynamo", False), f"{name} is not wrapped"
    params = [p for p, v in inspect.signature(function).parameters.items() if v.kind is not v.VAR_KEYWORD]
    missing = [p for p in params if flags.PYTHON_NAMES.get(p, (p,))[0] not in flags.FLAGS]
    assert missing == []


def test_an_option_without_a_row_is_refused_when_set():
    """What optimum adds later: refused when set, never dropped; at its default it changes nothing."""
    defaults = {**flags.cli_defaults(), "future_flag": None}
    with pytest.raises(flags.FlagError, match=r"^--future_flag is not known to optimum-dynamo"):
        flags.resolve({**defaults, "future_flag": 3}, defaults)
    options, notices = flags.resolve(defaults, defaults)
    assert notices == [] and "future_flag" not in options


def test_optimize_row_passes_the_level():
    row = flags.FLAGS["optimize"]
    assert row.kind == flags.HONOURED and row.option == "optimize_level"
    assert flags.resolve({"optimize": "O3"}, {"optimize": None})[0]["optimize_level"] == "O3"


def test_usage_docs_show_the_table():
    usage = (Path(__file__).parents[1] / "docs" / "usage.md").read_text()
    assert flags.markdown_table() in usage


REFUSED = [
    (["--dtype", "bf16"], "--dtype bf16: onnxruntime's CPU provider has no bfloat16 kernels"),
    (["--device", "cuda"], "--device cuda: no CUDA device is available"),
    (["--library-name", "diffusers"], "--library-name diffusers: diffusers models are not exported by --dynamo"),
    (["--library-name", "timm"], "--library-name timm: timm is not installed (pip install timm)"),
    (["--no-dynamic-axes"], "--no-dynamic-axes is not supported with --dynamo"),
    (["--variant", "split"], "--variant split: optimum's export variants are OnnxConfig layouts"),
    (["--slim"], "--slim: onnxslim is not installed"),
    pytest.param(["--model-kwargs", '{"not_an_argument": 1}'],  # CI: one environment (it runs the model)
                 "--model-kwargs: not_an_argument not an argument of LlamaForCausalLM.forward", marks=pytest.mark.once("t5")),
]


@pytest.mark.parametrize("extra,line", REFUSED, ids=[getattr(r, "values", r)[0][0] for r in REFUSED])
def test_refused_option_one_line_nonzero_exit_no_output(extra, line, checkpoints, tmp_path):
    if extra == ["--slim"] and importlib.util.find_spec("onnxslim") is not None:
        pytest.skip("onnxslim is installed: --slim is honoured")
    if extra == ["--library-name", "timm"] and importlib.util.find_spec("timm") is not None:
        pytest.skip("timm is installed: --library-name timm is honoured (test_timm)")
    out = tmp_path / "nested" / "out"
    run = optimum_cli("export", "onnx", "--dynamo", "--model", checkpoints("llama"), *extra, out)
    assert run.returncode != 0
    errors = [x for x in run.stderr.splitlines() if "error" in x.lower()]
    assert len(errors) == 1 and errors[0].startswith(f"optimum-cli export onnx --dynamo: error: {line}"), run.stderr[-2000:]
    assert "Traceback" not in run.stderr
    assert not (tmp_path / "nested").exists()


@pytest.mark.once("t5")  # CI: a refusal of ours, in one environment (make test-all: both)
def test_monolith_refused_for_encoder_decoder(bare_checkpoints, tmp_path):
    out = tmp_path / "out"
    run = optimum_cli("export", "onnx", "--dynamo", "--monolith", "--model", bare_checkpoints("t5"), "--task",
                      "text2text-generation-with-past", out)
    assert run.returncode != 0
    assert run.stderr.strip().splitlines()[-1].startswith(
        "optimum-cli export onnx --dynamo: error: --monolith: encoder-decoder models are exported as encoder + decoder")
    assert not out.exists()


@pytest.fixture(scope="module")
def flagged_export(bare_checkpoints, tmp_path_factory):
    """A bare llama exported with honoured and ignored options set."""
    out = tmp_path_factory.mktemp("flagged") / "out"
    run = optimum_cli("export", "onnx", "--dynamo", "--model", bare_checkpoints("llama"), "--pad_token_id", "5",
                      "--no-constant-folding", "--device", "cpu", "--framework", "pt", "--library-name", "transformers",
                      "--variant", "default", "--monolith", "--no-post-process", "--batch_size", "4",
                      "--sequence_length", "9", "--opset", "18", out)
    assert run.returncode == 0, run.stderr[-3000:]
    return out, run


@pytest.mark.once("t5")
def test_ignored_options_print_one_notice_each(flagged_export):
    _, run = flagged_export
    notices = [x for x in run.stderr.splitlines() if x.startswith("optimum-cli export onnx --dynamo: notice: ")]
    assert [n.split(": ")[2].split()[0] for n in notices] == ["--no-post-process", "--batch_size", "--sequence_length"]
    assert all("ignored with --dynamo" in n for n in notices)


def test_pad_token_id_opset_and_folding_in_output(flagged_export, bare_exports):
    out, _ = flagged_export
    assert json.loads((out / "config.json").read_text())["pad_token_id"] == 5
    flagged = onnx.load(out / "model.onnx", load_external_data=False)
    default = onnx.load(bare_exports("llama") / "model.onnx", load_external_data=False)
    assert {o.domain: o.version for o in flagged.opset_import}[""] == 18
    # without folding, the constant subgraphs (rotary tables, masks' constants) stay as nodes
    assert len(flagged.graph.node) > len(default.graph.node)
    assert [i.name for i in flagged.graph.input] == [i.name for i in default.graph.input]
    assert read_manifest(out)["exporter"] == "dynamo"


@pytest.mark.once("t4")
def test_model_kwargs_reach_the_forward(bare_checkpoints, tmp_path):
    out = tmp_path / "out"
    run = optimum_cli("export", "onnx", "--dynamo", "--model", bare_checkpoints("bert"), "--task", "feature-extraction",
                      "--model-kwargs", '{"output_hidden_states": true}', out)
    assert run.returncode == 0, run.stderr[-3000:]
    outputs = [o.name for o in onnx.load(out / "model.onnx", load_external_data=False).graph.output]
    assert outputs[0] == "last_hidden_state" and [o for o in outputs if o.startswith("hidden_states.")] == [
        f"hidden_states.{i}" for i in range(3)]


def test_slim_runs_onnxslim_when_installed(checkpoints, dynamo_exports, tmp_path):
    """T4 installs onnxslim (T5 does not: there --slim is refused, above)."""
    if importlib.util.find_spec("onnxslim") is None:
        pytest.skip("onnxslim is not installed: --slim is refused")
    from optimum.onnxruntime import ORTModelForCausalLM
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from parity import assert_causal_lm_parity, padded_batch

    plain, slim = dynamo_exports("llama"), tmp_path / "slim"  # the session's export without --slim
    run = optimum_cli("export", "onnx", "--dynamo", "--model", checkpoints("llama"), "--slim", slim)
    assert run.returncode == 0, run.stderr[-2000:]
    nodes = [len(onnx.load(str(d / "model.onnx"), load_external_data=False).graph.node) for d in (plain, slim)]
    assert nodes[1] < nodes[0], nodes  # onnxslim ran on the saved graph
    torch_model = AutoModelForCausalLM.from_pretrained(checkpoints("llama")).eval()
    assert_causal_lm_parity(ORTModelForCausalLM.from_pretrained(slim), torch_model,
                            padded_batch(AutoTokenizer.from_pretrained(slim)))


def test_executorch_docs_show_the_table():
    from optimum_dynamo.cli import executorch as executorch_cli

    page = (Path(__file__).parents[1] / "docs" / "executorch.md").read_text()
    assert flags.markdown_table(executorch_cli.FLAGS) in page
