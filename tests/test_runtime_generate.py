"""Validation runs the export as users run it: the runtime class's `generate` on the captured batches, against
PyTorch's greedy tokens (optimum_dynamo/validate/generate.py)."""

import pytest
import torch
from optimum.onnxruntime import ORTModelForCausalLM
from transformers import AutoModelForCausalLM

from optimum_dynamo.capture.drivers import Generation
from optimum_dynamo.validate import GrossMismatch
from optimum_dynamo.validate.generate import check_generate

from conftest import optimum_cli

OPTIONS = dict(do_sample=False, max_new_tokens=4, min_new_tokens=4, pad_token_id=0)


@pytest.fixture(scope="module")
def export(checkpoints, tmp_path_factory):
    out = tmp_path_factory.mktemp("generate") / "out"
    run = optimum_cli("export", "onnx", "--dynamo", "--no-fallback", "--model", checkpoints("llama"), out)
    assert run.returncode == 0, run.stderr[-3000:]
    return checkpoints("llama"), out, run.stderr


@pytest.mark.once("t4")
def test_the_export_log_says_what_was_generated(export):
    *_, log = export
    assert "    ORTModelForCausalLM.generate: PyTorch's greedy tokens on 2 captured batches" in log.splitlines()


def test_other_tokens_than_pytorch_fail_with_the_batch_row_and_token(export):
    checkpoint, out, _ = export
    inputs = dict(input_ids=torch.tensor([[0, 0, 5, 6, 7], [4, 5, 6, 7, 8]]),
                  attention_mask=torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]]))
    with torch.no_grad():
        tokens = AutoModelForCausalLM.from_pretrained(checkpoint).eval().generate(**inputs, **OPTIONS)[:, 5:]
    same = Generation(inputs, OPTIONS, tokens)
    assert check_generate(ORTModelForCausalLM, out, [same], use_cache=True) == (
        "ORTModelForCausalLM.generate: PyTorch's greedy tokens on 1 captured batch")
    other = tokens.clone()
    other[1, 2] = (other[1, 2] + 1) % 128  # what a runtime off from the third new token of row 1 would give
    with pytest.raises(GrossMismatch) as refused:
        check_generate(ORTModelForCausalLM, out, [same, Generation(inputs, OPTIONS, other)], use_cache=True)
    assert str(refused.value) == (
        "ORTModelForCausalLM.generate gives other greedy tokens than PyTorch's on captured batch 2 (row 1, new token "
        "3), although each graph call matched: the export is wrong as run")
