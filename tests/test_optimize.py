"""`optimum-cli export onnx --dynamo --optimize O1..O4`: fused graphs keep optimum's names and PyTorch's tokens."""

import onnx
import pytest
import torch
import transformers
from optimum.onnxruntime import ORTModelForCausalLM
from transformers import AutoModelForCausalLM, AutoTokenizer

from optimum_dynamo.manifest import read_manifest
from parity import assert_causal_lm_parity, padded_batch
from tiny import save_tiny_decoder

from conftest import optimum_cli

FUSED_MODELS = ["llama", "gemma2", "phi3", "qwen2"]
ONCE = {"llama": "t5", "phi3": "t5", "qwen2": "t4", "gemma2": "t4"}  # CI: in one environment (make test-all: both)


def _export(checkpoint, out, *flags):
    run = optimum_cli("export", "onnx", "--dynamo", "--model", checkpoint, "--task", "text-generation-with-past",
                      "--atol", "1e-4", *flags, out)
    assert run.returncode == 0, run.stderr[-3000:]
    return run


def _io_names(path):
    model = onnx.load(str(path / "model.onnx"), load_external_data=False)
    return [i.name for i in model.graph.input], [o.name for o in model.graph.output]


@pytest.fixture(scope="module")
def o3_exports(checkpoints, tmp_path_factory):
    """`--dynamo --optimize O3` exports (validated with --atol 1e-4), made once: o3_exports("llama") -> dir."""
    root, made = tmp_path_factory.mktemp("o3"), {}

    def get(model_type):
        if model_type not in made:
            run = _export(checkpoints(model_type), root / model_type, "--optimize", "O3")
            assert "onnxruntime vs PyTorch" in run.stderr  # the validation stage ran, under the --atol gate
            made[model_type] = root / model_type
        return made[model_type]

    return get


@pytest.mark.parametrize("model_type", [pytest.param(m, marks=pytest.mark.once(ONCE[m])) if m in ONCE else m
                                        for m in FUSED_MODELS])
def test_o3_greedy_and_names_match(model_type, checkpoints, dynamo_exports, o3_exports):
    """O3 on a left-padded batch: identical greedy tokens, logits within 1e-4, the plain export's I/O names."""
    out = o3_exports(model_type)
    ort_model = ORTModelForCausalLM.from_pretrained(out)
    torch_model = AutoModelForCausalLM.from_pretrained(checkpoints(model_type)).eval()
    assert_causal_lm_parity(ort_model, torch_model, padded_batch(AutoTokenizer.from_pretrained(out)))
    assert _io_names(out) == _io_names(dynamo_exports(model_type))
    manifest = read_manifest(out)
    layers = torch_model.config.num_hidden_layers
    assert manifest["optimize_level"] == "O3"
    # transformers 5 runs gemma2's attention eagerly (logit softcapping): no SDPA, nothing to fuse
    eager = model_type == "gemma2" and int(transformers.__version__.split(".")[0]) >= 5
    assert manifest["contrib_ops"].get("Attention", 0) == (0 if eager else layers)
    unfused = manifest["unfused"]  # a fusion that matched nothing says why
    assert unfused["cache_attention"].startswith("no ONNX Attention") if eager else "cache_attention" not in unfused
    assert "SkipSimplifiedLayerNormalization" in manifest["contrib_ops"]
    assert max(row["max_abs"] for row in manifest["discrepancies"]) < 1e-4


def test_o3_llama_layers_are_fused(checkpoints, o3_exports):
    """Per layer: ONNX Attention given the cache (no Concat of past and new keys, no If), two skip-norms, no
    repeated key/value heads, the past length read once.
    (RotaryEmbedding fuses on transformers 4 only: onnxscript's cos/sin-cache pattern does not match
    transformers 5's rotary.)"""
    out = o3_exports("llama")
    ops = read_manifest(out)["contrib_ops"]
    layers = AutoModelForCausalLM.from_pretrained(checkpoints("llama")).config.num_hidden_layers
    assert ops["Attention"] == layers and "GroupQueryAttention" not in ops
    assert ops["SkipSimplifiedLayerNormalization"] == 2 * layers
    graph = onnx.load(str(out / "model.onnx"), load_external_data=False).graph
    attentions = [n for n in graph.node if n.op_type == "Attention"]
    assert [n.input[4:] for n in attentions] == [[f"past_key_values.{i}.key", f"past_key_values.{i}.value"]
                                                 for i in range(layers)]
    assert not any(n.op_type in ("If", "Concat") and "past" in "".join(n.input) for n in graph.node)
    assert not any(n.op_type == "Expand" and "past" in n.input[0] for n in graph.node)
    past_reads = [n for n in graph.node if n.op_type == "Shape" and n.input[0].startswith("past_key_values")]
    assert len(past_reads) <= 2, [n.input[0] for n in past_reads]  # batch and past length, not per layer


def test_o3_continues_a_batch_over_its_cache(checkpoints, o3_exports):
    """Two rows continuing by three tokens over a non-empty cache (prefix caching, assisted decoding; the case
    onnxruntime's GroupQueryAttention refuses on CPU): logits = PyTorch's."""
    import numpy as np
    import onnxruntime as ort

    out = o3_exports("llama")
    torch_model = AutoModelForCausalLM.from_pretrained(checkpoints("llama")).eval()
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    inputs = padded_batch(AutoTokenizer.from_pretrained(out))
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    more = torch.tensor([[5, 6, 7], [8, 9, 10]])
    full_mask = torch.cat([mask, torch.ones_like(more)], dim=1)
    positions = (full_mask.cumsum(-1) - 1).clamp(min=0)
    feed = {"input_ids": more.numpy(), "attention_mask": full_mask.numpy(),
            "position_ids": positions[:, ids.shape[1]:].numpy()}
    with torch.no_grad():
        first = torch_model(input_ids=ids, attention_mask=mask, position_ids=positions[:, : ids.shape[1]])
        for i, layer in enumerate(first.past_key_values.to_legacy_cache()):  # before the cache grows
            feed[f"past_key_values.{i}.key"], feed[f"past_key_values.{i}.value"] = layer[0].numpy().copy(), \
                layer[1].numpy().copy()
        second = torch_model(input_ids=more, attention_mask=full_mask, position_ids=positions[:, ids.shape[1]:],
                             past_key_values=first.past_key_values)
    assert feed["past_key_values.0.key"].shape[2] == ids.shape[1]
    logits = session.run(["logits"], feed)[0]
    assert np.abs(logits - second.logits.numpy()).max() < 1e-4


@pytest.mark.parametrize("model_type", [pytest.param("mistral", marks=pytest.mark.once("t5")),  # CI: one each
                                        pytest.param("gemma2", marks=pytest.mark.once("t4"))])
def test_o3_keeps_bounded_sliding_caches(model_type, tmp_path):
    """Window 6 (sliding layers hold 5 positions; gemma2's layers alternate sliding / full) and a 9-token
    prompt: O3 generates like PyTorch. mistral's attentions are given the bounded cache."""
    sizes = dict(head_dim=16, query_pre_attn_scalar=16) if model_type == "gemma2" else {}
    ckpt = save_tiny_decoder(model_type, tmp_path / "ckpt", sliding_window=6, **sizes)
    out = tmp_path / "o3"
    _export(ckpt, out, "--optimize", "O3")
    if model_type == "mistral":
        manifest = read_manifest(out)
        assert manifest["contrib_ops"]["Attention"] == 2 and "cache_attention" not in manifest["unfused"]
    inputs = padded_batch(AutoTokenizer.from_pretrained(out))
    assert inputs["input_ids"].shape[1] > 6
    assert_causal_lm_parity(ORTModelForCausalLM.from_pretrained(out),
                            AutoModelForCausalLM.from_pretrained(ckpt).eval(), inputs)


@pytest.mark.parametrize("level", [pytest.param("O1", marks=pytest.mark.once("t5")),  # CI: one each
                                   pytest.param("O2", marks=pytest.mark.once("t4"))])
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
