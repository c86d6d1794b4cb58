"""Decoders fixed after the architecture sweep: `optimum-cli export onnx --dynamo` + ORTModelForCausalLM
against PyTorch (greedy tokens on a left-padded batch, first-step logits, the manifest's validation)."""

import numpy as np
import onnxruntime as ort
import pytest
import torch
import transformers
from optimum.onnxruntime import ORTModelForCausalLM
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

from optimum_dynamo.exporters.onnx_optimize import optimize
from optimum_dynamo.manifest import read_manifest
from parity import ATOL, assert_causal_lm_parity, padded_batch

ARCHS = {
    "helium": "rms-norm eps 1e-8, dropped by onnxscript's no-op rule -> NaN on padding rows",
    "biogpt": "transformers 4 derives default positions from the attention mask",
    "gpt_bigcode": "transformers 4: a plain forward builds an EncoderDecoderCache, generate a DynamicCache",
    "granite": "validation compared padding positions (logits axes were unnamed)",
    "gemma4_text": "cache head_dim differs per layer (transformers 5 only)",
    "minicpm3": "latent caches: key and value inputs of different sizes (transformers 5 only)",
    "gpt_oss": "transformers 4: data-dependent expert loop -> dense-experts patch (sliding window > sequence)",
    "hy_v4": "sparse attention: the indexer's cached keys are a cache leaf, 3-d (transformers 5 only)",
}


# fixes of transformers 4's code: under `slow` on transformers 5 (CI's time; `make zoo` runs every type on both)
FIXED_ON_4 = {"biogpt", "gpt_bigcode", "gpt_oss"}
ON_5 = transformers.__version__ >= "5"


# fixes of our own code, for both versions: in one environment each in CI
ONCE = {"granite": "t4"}
# under `slow` (CI's time), each fix checked in CI by a test of its own: helium's epsilon by
# test_optimizer_keeps_a_tiny_epsilon (both) and the t5 row of test_seq2seq_cli (end to end); gpt_oss's
# dense experts by test_patches' test_dense_experts_patch_equals_the_routing_loop
SLOW = {"helium", "gpt_oss"}


@pytest.mark.parametrize("model_type", [
    pytest.param(t, marks=pytest.mark.slow if t in SLOW or ON_5 and t in FIXED_ON_4 else
                 pytest.mark.once(ONCE[t]) if t in ONCE else ()) for t in ARCHS])
def test_parity_with_pytorch(model_type, checkpoints, dynamo_exports):
    if model_type not in CONFIG_MAPPING_NAMES:
        pytest.skip(f"{model_type} does not exist in this transformers")
    out = dynamo_exports(model_type)
    ort_model = ORTModelForCausalLM.from_pretrained(out)
    torch_model = AutoModelForCausalLM.from_pretrained(checkpoints(model_type)).eval()
    assert_causal_lm_parity(ort_model, torch_model, padded_batch(AutoTokenizer.from_pretrained(out)))
    worst = max(read_manifest(out)["discrepancies"], key=lambda row: row["max_abs"])
    assert worst["max_abs"] < ATOL, worst


class _RMSNorm(torch.nn.Module):
    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-8)


def test_optimizer_keeps_a_tiny_epsilon():
    """onnxscript 0.7.2 matches `x + 0` with abs_tol 1e-8; our optimizer must keep `+ 1e-8`."""
    program = torch.onnx.export(_RMSNorm(), (torch.ones(2, 4),), dynamo=True, optimize=False,
                                dynamic_shapes=({0: "batch"},))
    model = optimize(program.model)
    session = ort.InferenceSession(model_proto_bytes(model), providers=["CPUExecutionProvider"])
    x = np.array([[0.0] * 4, [1.0, 2.0, 3.0, 4.0]], dtype=np.float32)
    (got,) = session.run(None, {session.get_inputs()[0].name: x})
    assert np.isfinite(got).all(), got
    np.testing.assert_allclose(got, _RMSNorm()(torch.from_numpy(x)).numpy(), atol=1e-6)


def model_proto_bytes(model) -> bytes:
    import onnx_ir as ir

    return ir.serde.serialize_model(model).SerializeToString()
