"""`-with-past` for a causal LM that returns no cache (BERT-family models used as decoders with `is_decoder`
unset, on transformers 5): refused with one line at export time, nothing written; `text-generation` of the
same checkpoint gives a directory ORTModelForCausalLM loads and runs as exported."""

import torch
from optimum.onnxruntime import ORTModelForCausalLM
from transformers import AutoModelForCausalLM, AutoTokenizer

from conftest import optimum_cli
from parity import assert_causal_lm_parity, padded_batch
from tiny import save_tiny_decoder


def _returns_cache(model) -> bool:
    with torch.no_grad():
        out = model(input_ids=torch.tensor([[3, 4, 5]]), use_cache=True)
    cache = getattr(out, "past_key_values", None)
    return cache is not None and bool(len(cache))


def test_with_past_without_a_cache_is_one_line_and_nothing_written(tmp_path):
    ckpt, out = save_tiny_decoder("bert", tmp_path / "bert"), tmp_path / "out"
    torch_model = AutoModelForCausalLM.from_pretrained(ckpt).eval()
    run = optimum_cli("export", "onnx", "--dynamo", "--model", ckpt, "--task", "text-generation-with-past", out)
    if _returns_cache(torch_model):  # transformers 4 keeps a cache for BertLMHeadModel: a real -with-past export
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


def test_text_generation_without_a_cache_runs_as_exported(tmp_path):
    ckpt, out = save_tiny_decoder("bert", tmp_path / "bert"), tmp_path / "out"
    run = optimum_cli("export", "onnx", "--dynamo", "--model", ckpt, "--task", "text-generation", out)
    assert run.returncode == 0, run.stderr[-3000:]
    torch_model = AutoModelForCausalLM.from_pretrained(ckpt).eval()
    ort_model = ORTModelForCausalLM.from_pretrained(out, use_cache=False)
    assert_causal_lm_parity(ort_model, torch_model, padded_batch(AutoTokenizer.from_pretrained(out)))
