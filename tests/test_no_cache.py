"""`-with-past` for a causal LM whose `generate` keeps no cache (BERT-family models used as decoders with
`is_decoder` unset, on transformers 5): refused with one line at export time, nothing written, never a
directory ORTModelForCausalLM refuses at load."""

import pytest
import torch
from optimum.onnxruntime import ORTModelForCausalLM
from transformers import AutoModelForCausalLM, AutoTokenizer

from conftest import optimum_cli
from parity import assert_causal_lm_parity, padded_batch
from tiny import save_tiny_decoder


def _generate_keeps_cache(model) -> bool:
    """Whether the forward calls `generate` makes return a filled cache (read with a plain forward hook)."""
    returned = []
    handle = model.register_forward_hook(lambda module, args, out: returned.append(out.past_key_values))
    try:
        model.generate(input_ids=torch.tensor([[3, 4, 5]]), max_new_tokens=2, do_sample=False, pad_token_id=0)
    finally:
        handle.remove()
    return any(cache is not None and cache.get_seq_length() > 0 for cache in returned)


@pytest.mark.once("t4")
def test_with_past_without_a_cache_is_one_line_and_nothing_written(tmp_path):
    ckpt, out = save_tiny_decoder("bert", tmp_path / "bert"), tmp_path / "out"
    torch_model = AutoModelForCausalLM.from_pretrained(ckpt).eval()
    run = optimum_cli("export", "onnx", "--dynamo", "--model", ckpt, "--task", "text-generation-with-past", out)
    if _generate_keeps_cache(torch_model):  # transformers 4 keeps one for BertLMHeadModel: a real -with-past export
        assert run.returncode == 0, run.stderr[-3000:]
        assert_causal_lm_parity(ORTModelForCausalLM.from_pretrained(out), torch_model,
                                padded_batch(AutoTokenizer.from_pretrained(out)))
        return
    errors = [line for line in run.stderr.splitlines() if "error" in line]
    assert run.returncode == 1 and errors == [
        "optimum-cli export onnx --dynamo: error: dynamo export failed (PipelineError: bert returns no key/value cache "
        "from generate, so there is none for --task text-generation-with-past to carry; export with --task "
        "text-generation); no fallback: no torchscript OnnxConfig for bert/text-generation-with-past"]
    assert not out.exists()


@pytest.mark.once("t4")
def test_the_advised_task_exports_a_graph_the_runtime_runs(tmp_path):
    """`--task text-generation` (what the refusal advises): captured as `generate` runs without a cache, the
    whole sequence in every call, which is how ORTModelForCausalLM(use_cache=False) runs the graph."""
    ckpt, out = save_tiny_decoder("bert", tmp_path / "bert"), tmp_path / "out"
    run = optimum_cli("export", "onnx", "--dynamo", "--model", ckpt, "--task", "text-generation", out)
    assert run.returncode == 0, run.stderr[-3000:]
    ort_model = ORTModelForCausalLM.from_pretrained(out, use_cache=False)
    assert not ort_model.can_use_cache
    assert_causal_lm_parity(ort_model, AutoModelForCausalLM.from_pretrained(ckpt).eval(),
                            padded_batch(AutoTokenizer.from_pretrained(out)))


_NO_CACHE = ("returns no key/value cache from generate, so there is none for --task text-generation-with-past to "
             "carry; export with --task text-generation")
_NOT_A_CACHE = ("'s generate carries its past as a tuple of tensors, not a cache: optimum's runtime has no way to "
                "feed it back, so it cannot be exported for text generation")


@pytest.mark.parametrize("model_type, reason", [
    # openai-gpt's forward has no cache argument at all: refused before `generate` would say it in its own words
    # (`model_kwargs are not used by the model: ['past_key_values']`)
    pytest.param("openai-gpt", " " + _NO_CACHE, marks=pytest.mark.once("t4")),  # CI: one each
    # XLNet carries its memories (`mems`) as a tuple of tensors, which transformers' own generate cannot take back
    # (4.57: IndexError, 5.x: `Passing a tuple of past_key_values is not supported`)
    pytest.param("xlnet", _NOT_A_CACHE, marks=pytest.mark.once("t5")),
])
def test_a_model_without_a_cache_it_can_carry_is_refused_in_one_line(model_type, reason, tmp_path):
    import zoo
    from tiny import tiny_tokenizer

    ckpt, out = tmp_path / model_type, tmp_path / "out"
    AutoModelForCausalLM.from_config(zoo.tiny_config(model_type)).save_pretrained(ckpt)
    tiny_tokenizer(128).save_pretrained(ckpt)
    run = optimum_cli("export", "onnx", "--dynamo", "--model", ckpt, "--task", "text-generation-with-past", out)
    errors = [line for line in run.stderr.splitlines() if "error" in line]
    assert run.returncode == 1 and errors == [
        f"optimum-cli export onnx --dynamo: error: dynamo export failed (PipelineError: {model_type}{reason}); "
        f"no fallback: no torchscript OnnxConfig for {model_type}/text-generation-with-past"]
    assert not out.exists()
