"""Observer and inference on real generate() runs of a tiny model."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from optimum_dynamo.capture import CaptureError, drive_text_generation, infer_arguments, observe

INPUTS = ["input_ids", "attention_mask", "position_ids", "past_key_values"]


@pytest.fixture(scope="module")
def recorded(checkpoints):
    path = checkpoints("llama")
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    with observe(model) as obs:
        drive_text_generation(model, AutoTokenizer.from_pretrained(path))
    return obs


def test_every_call_is_recorded_with_kwargs_and_outputs(recorded):
    # 2 runs x (prefill + 2 decode steps) + the prefix forward of the second run
    assert len(recorded.calls) == 7 and recorded.dropped == 0
    assert all("input_ids" in c.kwargs and c.outputs is not None for c in recorded.calls)


def test_cache_snapshots_are_not_mutated_by_later_calls(recorded):
    past = [c.kwargs["past_key_values"].get_seq_length() if c.kwargs.get("past_key_values") is not None else 0
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
    assert sample["past_key_values"].get_seq_length() >= 2
    assert sample["use_cache"] is True


def test_no_call_with_every_axis_above_one_is_an_error(recorded):
    one_generate = recorded.calls[:3]  # prefill (empty cache) then one-token decode steps
    with pytest.raises(CaptureError, match="every varying axis >= 2"):
        infer_arguments(one_generate, INPUTS)


def test_cap_is_explicit(checkpoints):
    model = AutoModelForCausalLM.from_pretrained(checkpoints("llama")).eval()
    from optimum_dynamo.capture import InputObserver

    with InputObserver(model, max_calls=2) as obs, torch.no_grad():
        for _ in range(3):
            model(input_ids=torch.tensor([[4, 5, 6]]))
    assert len(obs.calls) == 2 and obs.dropped == 1
    assert "1 dropped" in obs.summary()
