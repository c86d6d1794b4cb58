"""`optimum-cli export onnx --dynamo --optimize O1..O4`: fused graphs keep optimum's names and PyTorch's tokens."""

import onnx
import pytest
from optimum.onnxruntime import ORTModelForCausalLM
from transformers import AutoModelForCausalLM, AutoTokenizer

from optimum_dynamo.manifest import read_manifest
from parity import assert_causal_lm_parity, padded_batch

from conftest import optimum_cli

FUSED_MODELS = ["llama", "gemma2", "phi3", "qwen2"]


def _export(checkpoint, out, *flags):
    run = optimum_cli("export", "onnx", "--dynamo", "--model", checkpoint, "--task", "text-generation-with-past",
                      "--atol", "1e-4", *flags, out)
    assert run.returncode == 0, run.stderr[-3000:]
    return run


def _io_names(path):
    model = onnx.load(str(path / "model.onnx"), load_external_data=False)
    return [i.name for i in model.graph.input], [o.name for o in model.graph.output]


@pytest.mark.parametrize("model_type", FUSED_MODELS)
def test_o3_greedy_and_names_match(model_type, checkpoints, dynamo_exports, tmp_path):
    """O3 on a left-padded batch: identical greedy tokens, logits within 1e-4, the plain export's I/O names."""
    out = tmp_path / "o3"
    run = _export(checkpoints(model_type), out, "--optimize", "O3")
    assert "onnxruntime vs PyTorch" in run.stderr  # the validation stage ran, under the --atol gate
    ort_model = ORTModelForCausalLM.from_pretrained(out)
    torch_model = AutoModelForCausalLM.from_pretrained(checkpoints(model_type)).eval()
    assert_causal_lm_parity(ort_model, torch_model, padded_batch(AutoTokenizer.from_pretrained(out)))
    assert _io_names(out) == _io_names(dynamo_exports(model_type))
    manifest = read_manifest(out)
    assert manifest["optimize_level"] == "O3"
    assert "SkipSimplifiedLayerNormalization" in manifest["contrib_ops"]
    assert max(row["max_abs"] for row in manifest["discrepancies"]) < 1e-4


def test_o3_llama_fuses_attention_and_norms(checkpoints, tmp_path):
    """One Attention per layer on the unrepeated kv heads, two skip-norms per layer. (RotaryEmbedding fuses
    on transformers 4 only: onnxscript's cos/sin-cache pattern does not match transformers 5's rotary.)"""
    out = tmp_path / "o3"
    _export(checkpoints("llama"), out, "--optimize", "O3")
    ops = read_manifest(out)["contrib_ops"]
    layers = AutoModelForCausalLM.from_pretrained(checkpoints("llama")).config.num_hidden_layers
    assert ops["Attention"] == layers and ops["SkipSimplifiedLayerNormalization"] == 2 * layers
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    assert not any(n.op_type == "Expand" and "past" in n.input[0] for n in model.graph.node)


@pytest.mark.parametrize("level", ["O1", "O2"])
def test_o1_o2_standard_onnx_only(level, checkpoints, tmp_path):
    out = tmp_path / level
    _export(checkpoints("llama"), out, "--optimize", level)
    manifest = read_manifest(out)
    assert manifest["optimize_level"] == level and manifest["contrib_ops"] == {}
    ort_model = ORTModelForCausalLM.from_pretrained(out)
    torch_model = AutoModelForCausalLM.from_pretrained(checkpoints("llama")).eval()
    assert_causal_lm_parity(ort_model, torch_model, padded_batch(AutoTokenizer.from_pretrained(out)))


def test_o4_without_gpu_is_refused(checkpoints, tmp_path):
    out = tmp_path / "o4"
    run = optimum_cli("export", "onnx", "--dynamo", "--optimize", "O4", "--model", checkpoints("llama"),
                      "--task", "text-generation-with-past", out)
    assert run.returncode != 0
    assert run.stderr.strip().splitlines()[-1] == (
        "optimum-cli export onnx --dynamo: error: --optimize O4 (O3 + fp16) needs a CUDA GPU and "
        "onnxruntime-gpu; none is available: use O3"
    )
    assert not out.exists()
