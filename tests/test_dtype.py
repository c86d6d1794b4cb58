"""`--dtype fp16`: graph, weights and I/O in float16, validated against the PyTorch model in float16;
through ORTModelForCausalLM the greedy tokens equal PyTorch's (float16) on a left-padded batch.
(`--dtype bf16` is refused: tests/test_flags.py.)"""

import onnx
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from optimum_dynamo.manifest import read_manifest

from conftest import optimum_cli
from parity import assert_causal_lm_parity, padded_batch

# ONNX Runtime CPU against PyTorch CPU, both float16: each op rounds to 11 bits, in different orders.
FP16_ATOL = 1e-2


@pytest.fixture(scope="module")
def fp16_export(checkpoints, tmp_path_factory):
    out = tmp_path_factory.mktemp("fp16") / "out"
    run = optimum_cli("export", "onnx", "--dynamo", "--no-fallback", "--dtype", "fp16", "--model", checkpoints("llama"), out)
    assert run.returncode == 0, run.stderr[-3000:]
    return out


@pytest.mark.once("t4")
def test_weights_and_io_are_float16(fp16_export, checkpoints):
    import math

    model = onnx.load(fp16_export / "model.onnx")
    parameters = set(AutoModelForCausalLM.from_pretrained(checkpoints("llama")).state_dict())
    weights = [i for i in model.graph.initializer if i.name in parameters]
    assert weights and {i.data_type for i in weights} == {onnx.TensorProto.FLOAT16}
    # float32 only where PyTorch computes in float32 too (rotary frequencies, norm epsilons): a few scalars
    float32 = [i for i in model.graph.initializer if i.data_type == onnx.TensorProto.FLOAT]
    assert all(math.prod(i.dims) <= 64 for i in float32), [(i.name, list(i.dims)) for i in float32]
    types = {v.name: v.type.tensor_type.elem_type for v in [*model.graph.input, *model.graph.output]}
    assert types["logits"] == types["past_key_values.0.key"] == types["present.1.value"] == onnx.TensorProto.FLOAT16
    assert types["input_ids"] == onnx.TensorProto.INT64
    manifest = read_manifest(fp16_export)
    assert manifest["dtype"] == "fp16" and max(r["max_abs"] for r in manifest["discrepancies"]) < FP16_ATOL


def test_greedy_tokens_equal_pytorch_fp16_on_left_padded_batch(fp16_export, checkpoints):
    from optimum.onnxruntime import ORTModelForCausalLM

    torch_model = AutoModelForCausalLM.from_pretrained(checkpoints("llama")).eval().to(torch.float16)
    ort_model = ORTModelForCausalLM.from_pretrained(fp16_export)
    inputs = padded_batch(AutoTokenizer.from_pretrained(checkpoints("llama")))
    diff = assert_causal_lm_parity(ort_model, torch_model, inputs, atol=FP16_ATOL)
    print(f"fp16 first-step logits max abs diff {diff:.2e}")
