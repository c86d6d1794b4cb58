"""`optimum_dynamo.InputObserver`: torch.onnx.InputObserver's API, on this package's capture.

The three scenarios of that API (two plain tensors; an LLM with a DynamicCache during generate; a VLM with
`pixel_values` on the first call only), exported for real and compared with PyTorch on calls not observed.
"""

from __future__ import annotations

import copy

import pytest
import torch

import optimum_dynamo
from optimum_dynamo import flatten
from tiny import save_tiny_vlm, tiny_config
from legacy_bridge import cache_argument

CACHE = cache_argument.name()  # what the installed transformers calls the cache argument
TRANSFORMERS_4 = __import__("transformers").__version__.startswith("4.")

DYNAMIC = torch.export.Dim.DYNAMIC
EMPTY_CACHE_FAILURE = "tensors but previously got 0 tensors"  # torch's observer on an empty prefill cache


class Add(torch.nn.Module):
    def forward(self, x, y):
        return x + y


def _observe_add(cls):
    torch.manual_seed(0)
    model, observer = Add(), cls()
    with observer(model):
        for n in (6, 7, 8, 9):
            model(torch.randn(n if n == 6 else 7, n), torch.randn(1, n))
    return model, observer


def test_two_tensors_same_shapes_as_torch_s_and_onnx_parity():
    model, ours = _observe_add(optimum_dynamo.InputObserver)
    _, theirs = _observe_add(torch.onnx.InputObserver)
    assert ours.num_obs() == theirs.num_obs() == 3
    assert ours.infer_dynamic_shapes() == theirs.infer_dynamic_shapes() == ({0: DYNAMIC, 1: DYNAMIC}, {1: DYNAMIC})
    assert ours.infer_dynamic_shapes({0}) == theirs.infer_dynamic_shapes({0})
    ours_args, theirs_args = ours.infer_arguments(), theirs.infer_arguments()
    assert isinstance(ours_args, tuple) and isinstance(theirs_args, tuple)
    # torch's sample is the first call; ours the last call whose dynamic axes are all >= 2
    assert [t.shape for t in theirs_args] == [(6, 6), (1, 6)]
    assert [t.shape for t in ours_args] == [(7, 8), (1, 8)]
    assert [t.shape for t in ours.infer_arguments(1, flat=True)] == [(7, 7), (1, 7)]
    program = torch.onnx.export(model, ours_args, dynamic_shapes=ours.infer_dynamic_shapes(), dynamo=True)
    assert [row["SUCCESS"] for row in ours.check_discrepancies(program)] == [True] * 3
    x, y = torch.randn(11, 13), torch.randn(1, 13)  # a shape never observed
    torch.testing.assert_close(program(x, y)[0], x + y, atol=1e-4, rtol=0)


def _tiny_llm(model_type="llama"):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(tiny_config(model_type)).eval()


def _padded_batch():
    torch.manual_seed(1)
    ids = torch.randint(3, 128, (2, 6))
    mask = torch.ones_like(ids)
    ids[1, :2], mask[1, :2] = 0, 0
    return ids, mask


def _generate(model, observer, mask=True):
    ids, attention = _padded_batch()
    with observer(model):
        model.generate(input_ids=ids, attention_mask=attention if mask else None, max_new_tokens=4,
                       do_sample=False, pad_token_id=0)


def test_torch_s_observer_fails_on_generate_and_ours_exports():
    model = _tiny_llm()
    theirs = torch.onnx.InputObserver()
    with flatten.registered():  # without it torch's fails earlier: 'DynamicCache' object has no attribute 'clone'
        _generate(model, theirs)
        try:
            theirs.infer_arguments()
        except RuntimeError as e:
            assert EMPTY_CACHE_FAILURE in str(e)
        else:
            pytest.skip("torch's InputObserver now handles the empty prefill cache: compare with it instead")
    ours = optimum_dynamo.InputObserver()
    _generate(model, ours)
    kwargs, shapes = ours.infer_arguments(), ours.infer_dynamic_shapes()
    cache = kwargs[CACHE]
    assert type(cache).__name__ == "DynamicCache" and flatten.is_registered(type(cache))
    assert shapes["input_ids"] == shapes["attention_mask"] == {0: DYNAMIC, 1: DYNAMIC}
    assert shapes[CACHE] == [{0: DYNAMIC, 2: DYNAMIC}] * 4  # 2 layers x (key, value)
    program = torch.onnx.export(model, (), kwargs=kwargs, dynamic_shapes=shapes, dynamo=True)
    rows = ours.check_discrepancies(program)
    assert [row["n_empty"] for row in rows] == [4, 0, 0]  # the prefill's empty cache, fed empty
    assert all(row["SUCCESS"] for row in rows[1:])  # the prefill differs only at padded positions (row 1)

    # a call never observed: batch 3, a 5-token past, 2 new tokens
    torch.manual_seed(2)
    with torch.no_grad():
        past = model(torch.randint(3, 128, (3, 5)), use_cache=True).past_key_values
        call = dict(input_ids=torch.randint(3, 128, (3, 2)), attention_mask=torch.ones(3, 7, dtype=torch.long),
                    position_ids=torch.arange(5, 7).expand(3, 2), **{CACHE: past})
        if "cache_position" in kwargs:  # transformers 4
            call["cache_position"] = torch.arange(5, 7)
        expected = model(**copy.deepcopy(call), use_cache=True)
    got = program(**call)
    torch.testing.assert_close(got[0], expected.logits[:, -1:], atol=1e-4, rtol=0)
    _, leaves, _ = flatten.flatten_cache(expected.past_key_values)
    for have, want in zip(got[1:], leaves):
        torch.testing.assert_close(have, want, atol=1e-4, rtol=0)


@pytest.mark.skipif(TRANSFORMERS_4, reason="transformers 4's Mamba generate passes a filled MambaCache at prefill, "
                    "so the prefill (whose multi-token path ignores the state) is the sample; not handled yet")
def test_state_cache_exports_the_decode_step():
    model = _tiny_llm("mamba")
    ours = optimum_dynamo.InputObserver()
    _generate(model, ours, mask=False)
    kwargs, shapes = ours.infer_arguments(), ours.infer_dynamic_shapes()
    name = cache_argument.parameter(kwargs)
    assert kwargs["input_ids"].shape[1] == 1 and shapes["input_ids"] == {0: DYNAMIC}  # one token per step
    program = torch.onnx.export(model, (), kwargs=kwargs, dynamic_shapes=shapes, dynamo=True)
    rows = ours.check_discrepancies(program)
    assert all(row["SUCCESS"] for row in rows[1:]), rows  # the decode steps; the prefill is no decode step
    with torch.no_grad():  # a state never observed: another prompt, batch 3
        state = model(torch.randint(3, 128, (3, 4)), use_cache=True).cache_params
        call = {"input_ids": torch.randint(3, 128, (3, 1)), name: state}
        expected = model(**copy.deepcopy(call), use_cache=True).logits
    torch.testing.assert_close(program(**call)[0], expected, atol=1e-4, rtol=0)


def _vlm(tmp_path):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from optimum_dynamo.exporters.vision_language import default_image, default_prompt

    path = save_tiny_vlm("gemma3", tmp_path / "gemma3")
    model = AutoModelForImageTextToText.from_pretrained(path).eval()
    processor = AutoProcessor.from_pretrained(path)

    def inputs(seed, words):
        prompt = default_prompt(processor)
        texts = [prompt, " ".join(["hello", prompt, *["again"] * words])]
        images = [[default_image(seed=seed)], [default_image(seed=seed + 1)]]
        batch = processor(images=images, text=texts, return_tensors="pt", padding=True)
        return {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "pixel_values", "token_type_ids")}

    return model, inputs


def _first_then_steps(model, inputs, steps=2):
    """Pixels on the first call only (as generate did before transformers 5 pre-encodes images)."""
    from transformers import DynamicCache

    out = model(**inputs, **{CACHE: DynamicCache(config=model.config)}, use_cache=True)
    mask = inputs["attention_mask"]
    for _ in range(steps):
        token = out.logits[:, -1:].argmax(-1)
        mask = torch.cat([mask, torch.ones_like(token)], 1)
        out = model(input_ids=token, attention_mask=mask, **{CACHE: cache_argument.of(out)}, use_cache=True)


@pytest.mark.skipif(TRANSFORMERS_4, reason="transformers 4.57's Gemma3 get_placeholder_mask guards on the data-dependent "
                    "count of image tokens (torch.export: GuardOnDataDependentSymNode); export_vlm splits the model")
def test_pixels_on_the_first_call_only(tmp_path, monkeypatch):
    model, inputs = _vlm(tmp_path)
    first = inputs(0, 3)
    missing = dict(pixel_values=torch.empty((0, *first["pixel_values"].shape[1:])))
    theirs = torch.onnx.InputObserver(value_if_missing=missing)
    with flatten.registered(), torch.no_grad():
        with theirs(model):
            _first_then_steps(model, first)
        try:  # token_type_ids too are on the first call only
            theirs.infer_arguments()
        except RuntimeError as e:
            assert "must contain all the named arguments" in str(e) or EMPTY_CACHE_FAILURE in str(e)
        else:
            pytest.fail("torch's InputObserver now infers this: compare its arguments with ours here")
    ours = optimum_dynamo.InputObserver(value_if_missing=missing)
    with ours(model), torch.no_grad():
        _first_then_steps(model, first)
    kwargs, shapes = ours.infer_arguments(), ours.infer_dynamic_shapes()
    assert kwargs["pixel_values"].shape[0] == 2  # the sample is the first call (its past grown to 2)
    assert shapes["pixel_values"] == {0: DYNAMIC} and shapes["token_type_ids"] == {0: DYNAMIC, 1: DYNAMIC}
    program = torch.export.export(model, (), kwargs=kwargs, dynamic_shapes=shapes).module()
    # A call not observed: other images, another prompt length, after a 3-token prefix. (The graph was traced
    # with a past of 2, and Gemma3 takes another branch for token types without a past: not an empty cache.)
    with torch.no_grad():
        call = inputs(5, 6)
        batch = call["input_ids"].shape[0]
        prefix = model(input_ids=torch.randint(7, 100, (batch, 3)), use_cache=True).past_key_values
        call["attention_mask"] = torch.cat([torch.ones(batch, 3, dtype=torch.long), call["attention_mask"]], 1)
        expected = model(**copy.deepcopy(call), **{CACHE: copy.deepcopy(prefix)}, use_cache=True).logits
        got = program(**ours.infer_arguments({**call, CACHE: prefix})).logits
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)
    # ONNX: Gemma3's image-token count check (torch_compilable_check) traces to aten._is_all_true, which
    # torch.onnx cannot translate; transformers' switch turns such checks off
    monkeypatch.setenv("TRANSFORMERS_DISABLE_TORCH_CHECK", "1")
    onnx_program = torch.onnx.export(model, (), kwargs=kwargs, dynamic_shapes=shapes, dynamo=True)
    feeds = ours.infer_arguments({**call, CACHE: prefix}, flat=True)
    torch.testing.assert_close(onnx_program(*feeds)[0], expected, atol=1e-4, rtol=0)
