"""Observer and inference on real generate() runs of a tiny model."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from optimum_dynamo.capture import CaptureError, drive_text_generation, infer_arguments, observe
from legacy_bridge import cache_argument

CACHE = cache_argument.name()  # what the installed transformers calls the cache argument
INPUTS = ["input_ids", "attention_mask", "position_ids", CACHE]


@pytest.fixture(scope="module")
def recorded(checkpoints):
    path = checkpoints("llama")
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    with observe(model) as obs:
        drive_text_generation(model, AutoTokenizer.from_pretrained(path))
    return obs


def test_every_call_is_recorded_with_kwargs_and_outputs(recorded):
    # 2 runs x (prefill + 2 decode steps) + the prefix of the second run (a one-token generate: its prefill)
    assert len(recorded.calls) == 7 and recorded.dropped == 0
    assert all("input_ids" in c.kwargs and c.outputs is not None for c in recorded.calls)


def test_cache_snapshots_are_not_mutated_by_later_calls(recorded):
    past = [c.kwargs[CACHE].get_seq_length() if c.kwargs.get(CACHE) is not None else 0
            for c in recorded.calls]
    # first generate: prefill (empty) then two one-token decode steps, each seeing one more position
    assert past[0] == 0 and past[1] > 0 and past[2] == past[1] + 1


def test_inferred_axes_and_names(recorded):
    args = infer_arguments(recorded.calls, INPUTS, {"use_cache": True})
    assert args.input_names[:3] == ["input_ids", "attention_mask", "position_ids"]
    assert args.input_names[3:5] == ["past_key_values.0.key", "past_key_values.0.value"]
    assert args.axis_names["input_ids"] == {0: "batch_size", 1: "sequence_length"}
    assert args.axis_names["attention_mask"] == {0: "batch_size", 1: "past_sequence_length + sequence_length"}
    assert args.axis_names["past_key_values.1.value"] == {0: "batch_size", 2: "past_sequence_length"}
    sample = args.kwargs
    assert sample["input_ids"].shape[0] >= 2 and sample["input_ids"].shape[1] >= 2
    assert sample[CACHE].get_seq_length() >= 2
    assert sample["use_cache"] is True


def test_one_generate_run_is_grown_to_a_usable_sample(recorded):
    """Prefill has no cache and decode steps one token: the sample is grown, keeping mask = past + new."""
    args = infer_arguments(recorded.calls[:3], INPUTS, {"use_cache": True})
    sample = args.kwargs
    past = sample[CACHE].get_seq_length()
    assert sample["input_ids"].shape[1] == 2 and sample["position_ids"].shape[1] == 2
    assert past >= 2 and sample["attention_mask"].shape[1] == past + 2
    assert args.axis_names["input_ids"] == {0: "batch_size", 1: "sequence_length"}


def test_a_batch_that_never_varied_is_still_dynamic(recorded):
    first_run = recorded.calls[:3]  # batch 2 throughout
    args = infer_arguments(first_run, INPUTS, {"use_cache": True})
    assert args.axis_names["input_ids"][0] == "batch_size"
    fixed = infer_arguments(first_run, INPUTS, {"use_cache": True}, dynamic_batch=False)
    assert 0 not in fixed.axis_names["input_ids"]


def test_cap_is_explicit(checkpoints):
    model = AutoModelForCausalLM.from_pretrained(checkpoints("llama")).eval()
    from optimum_dynamo.capture import InputObserver

    with InputObserver(model, max_calls=2) as obs, torch.no_grad():
        for _ in range(3):
            model(input_ids=torch.tensor([[4, 5, 6]]))
    assert len(obs.calls) == 2 and obs.dropped == 1
    assert "1 dropped" in obs.summary()


def test_rank_change_is_an_error(recorded):
    from optimum_dynamo.capture import Call

    calls = [Call({"input_ids": torch.zeros(2, 3, dtype=torch.long)}), Call({"input_ids": torch.zeros(2, 3, 1)})]
    with pytest.raises(CaptureError, match="'input_ids' changes rank"):
        infer_arguments(calls, ["input_ids"])


def test_a_tokenizer_that_gives_no_ids_is_replaced_by_random_ones(tmp_path):
    """transformers 5 loads a word-level tokenizer.json saved beside a qwen2 config as Qwen2Tokenizer, which gives
    no ids at all: the forward capture then runs random ids of two lengths, as without a tokenizer."""
    import transformers

    from optimum_dynamo.capture.samples import FORWARD_TEXTS, text_batches
    from tiny import tiny_config, tiny_tokenizer

    model = transformers.AutoModelForSequenceClassification.from_config(tiny_config("qwen2")).eval()
    model.save_pretrained(tmp_path)
    tiny_tokenizer(128).save_pretrained(tmp_path)
    batches = text_batches(model, AutoTokenizer.from_pretrained(tmp_path), FORWARD_TEXTS)
    assert [tuple(b["input_ids"].shape) for b in batches] in ([(2, 6), (3, 11)], [(2, 5), (3, 8)])
    assert all(int(b["input_ids"].max()) < model.config.vocab_size for b in batches)
