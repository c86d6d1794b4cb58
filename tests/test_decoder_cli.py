"""`optimum-cli export onnx --dynamo` for decoders, checked through ORTModelForCausalLM."""

import json

import onnx
import pytest
import torch
from optimum.onnxruntime import ORTModelForCausalLM
from transformers import AutoModelForCausalLM, AutoTokenizer

from optimum_dynamo.manifest import read_manifest
from parity import assert_causal_lm_parity, greedy, padded_batch

from conftest import optimum_cli

MODELS = ["llama", "qwen2", "gpt2", "phi3", "gemma2"]
ONCE = {"qwen2": "t4", "gpt2": "t5", "phi3": "t5"}  # CI: in one environment (make test-all: both)


@pytest.mark.parametrize("model_type", [pytest.param(m, marks=pytest.mark.once(ONCE[m])) if m in ONCE else m
                                        for m in MODELS])
def test_greedy_and_logits_match_pytorch(model_type, checkpoints, dynamo_exports):
    out = dynamo_exports(model_type)
    ort_model = ORTModelForCausalLM.from_pretrained(out)
    torch_model = AutoModelForCausalLM.from_pretrained(checkpoints(model_type)).eval()
    inputs = padded_batch(AutoTokenizer.from_pretrained(out))
    assert_causal_lm_parity(ort_model, torch_model, inputs)
    manifest = read_manifest(out)
    assert manifest["exporter"] == "dynamo" and manifest["task"] == "text-generation-with-past"
    assert max(row["max_abs"] for row in manifest["discrepancies"]) < 1e-4


@pytest.mark.parametrize("batch", [1, 3])
def test_graph_from_batch_2_sample_runs_at_other_batches(batch, checkpoints, dynamo_exports):
    out = dynamo_exports("llama")
    tokenizer = AutoTokenizer.from_pretrained(out)
    prompts = ["the quick brown fox", "hello", "a tiny model speaks in random words"][:batch]
    tokenizer.padding_side = "left"
    inputs = dict(tokenizer(prompts, return_tensors="pt", padding=True))
    inputs.pop("token_type_ids", None)
    ort_model = ORTModelForCausalLM.from_pretrained(out)
    torch_model = AutoModelForCausalLM.from_pretrained(checkpoints("llama")).eval()
    assert torch.equal(greedy(ort_model, inputs), greedy(torch_model, inputs))


def _io_names(path):
    model = onnx.load(str(path / "model.onnx"), load_external_data=False)
    return [i.name for i in model.graph.input], [o.name for o in model.graph.output]


# the names are the cache layout's, not the family's: llama's (position_ids) and gemma2's (none in its torchscript
# config) in one environment each, the others under `slow` (CI's time)
@pytest.mark.parametrize("model_type", [pytest.param(m, marks=pytest.mark.once("t5" if m == "llama" else "t4"))
                                        if m in ("llama", "gemma2") else pytest.param(m, marks=pytest.mark.slow)
                                        for m in MODELS])
def test_io_names_equal_torchscript_export(model_type, checkpoints, dynamo_exports, tmp_path):
    run = optimum_cli("export", "onnx", "--model", checkpoints(model_type), "--task", "text-generation-with-past",
                      tmp_path / "ts")
    assert run.returncode == 0, run.stderr[-3000:]
    ts_inputs, ts_outputs = _io_names(tmp_path / "ts")
    inputs, outputs = _io_names(dynamo_exports(model_type))
    assert outputs == ts_outputs
    if "position_ids" in ts_inputs:
        assert inputs == ts_inputs
    else:
        # gemma2's torchscript config omits position_ids, so its graph cannot serve left-padded batches;
        # the dynamo export keeps them, in forward-signature order.
        assert [n for n in inputs if n != "position_ids"] == ts_inputs
        assert inputs.index("position_ids") == inputs.index("attention_mask") + 1


def test_from_pretrained_export_dynamo(checkpoints):
    ckpt = checkpoints("qwen2")
    ort_model = ORTModelForCausalLM.from_pretrained(ckpt, export=True, dynamo=True)
    manifest = json.loads((ort_model.model_save_dir / "optimum_dynamo.json").read_text())
    assert manifest["exporter"] == "dynamo"
    torch_model = AutoModelForCausalLM.from_pretrained(ckpt).eval()
    assert_causal_lm_parity(ort_model, torch_model, padded_batch(AutoTokenizer.from_pretrained(ckpt)))


@pytest.mark.parametrize("model_type", [pytest.param("mixtral", marks=pytest.mark.once("t5")),  # CI: one each
                                        pytest.param("qwen2_moe", marks=pytest.mark.once("t4"))])
def test_moe_exports(model_type, checkpoints, dynamo_exports):
    """transformers 5: batched-matmul experts; transformers 4: the dense-experts patch."""
    out = dynamo_exports(model_type)
    ort_model = ORTModelForCausalLM.from_pretrained(out)
    torch_model = AutoModelForCausalLM.from_pretrained(checkpoints(model_type)).eval()
    assert_causal_lm_parity(ort_model, torch_model, padded_batch(AutoTokenizer.from_pretrained(out)))
