"""EncoderDecoderCache: flattening with optimum's seq2seq names, capture of encoder and decoder
during real generate() runs of tiny T5 and BART models, and torch.export of the decoder."""

import json

import pytest
import torch
import torch.utils._pytree as pytree
from transformers import AutoConfig, AutoModelForSeq2SeqLM, DynamicCache, EncoderDecoderCache

from optimum_dynamo import flatten, patches
from optimum_dynamo.capture import infer_arguments, observe, snapshot
from legacy_bridge import cache_argument

CACHE = cache_argument.name()  # what the installed transformers calls the cache argument
CONFIGS = {
    "t5": dict(
        d_model=32, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4, d_kv=8, vocab_size=128,
        decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
    ),
    "bart": dict(
        d_model=32, encoder_ffn_dim=64, decoder_ffn_dim=64, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, vocab_size=128, max_position_embeddings=64,
        decoder_start_token_id=2, bos_token_id=0, pad_token_id=1, eos_token_id=2,
        forced_bos_token_id=None, forced_eos_token_id=None,
    ),
}
LAYERS = 2
NAMES = [f"{i}.{part}.{kv}" for i in range(LAYERS) for part in ("decoder", "encoder") for kv in ("key", "value")]
ENCODER_INPUTS = ["input_ids", "attention_mask"]
# Tensor inputs of T5Stack / BartDecoder.forward; infer_arguments keeps those that were recorded.
DECODER_INPUTS = ["input_ids", "attention_mask", "encoder_hidden_states", "encoder_attention_mask", CACHE]
# (batch, encoder length, seed) of the two generate() calls; row 0 is left-padded.
RUNS = [(2, 5, 0), (3, 7, 1)]
NEW_TOKENS = 4


def _model(model_type):
    torch.manual_seed(0)
    return AutoModelForSeq2SeqLM.from_config(AutoConfig.for_model(model_type, **CONFIGS[model_type])).eval()


def _encoder_inputs(model_type, batch, length, seed, pad=2):
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, 128, (batch, length), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    input_ids[0, :pad] = CONFIGS[model_type]["pad_token_id"]
    attention_mask[0, :pad] = 0
    return dict(input_ids=input_ids, attention_mask=attention_mask)


def _filled_cache(model, model_type, decoder_length=3):
    """The EncoderDecoderCache of a real forward: self-attention over 3 tokens, cross over 5."""
    inputs = _encoder_inputs(model_type, 2, 5, seed=0)
    decoder_input_ids = torch.randint(3, 128, (2, decoder_length), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        out = model(**inputs, decoder_input_ids=decoder_input_ids, use_cache=True)
    assert type(out.past_key_values) is EncoderDecoderCache
    return inputs, out


def _same_tensors(a, b):
    return len(a) == len(b) and all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(a, b))


# (a) round trips --------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def model_type(request):
    return request.param


@pytest.fixture(scope="module")
def model(model_type):
    return _model(model_type)


def test_round_trip_keeps_tensors_names_and_state(model, model_type):
    _, out = _filled_cache(model, model_type)
    cache = out.past_key_values
    names, tensors, context = flatten.flatten_cache(cache)
    assert names == NAMES
    assert [tuple(t.shape)[2] for t in tensors] == [3, 3, 5, 5] * LAYERS  # decoder past 3, encoder 5
    assert tensors[4] is cache.self_attention_cache.layers[1].keys  # leaves are the cache's own tensors
    assert tensors[7] is cache.cross_attention_cache.layers[1].values
    hash(context)
    assert json.loads(json.dumps(context)) is not None  # JSON-able: tuples of str / int / bool only

    rebuilt = flatten.unflatten_cache(EncoderDecoderCache, context, tensors)
    assert type(rebuilt) is EncoderDecoderCache
    assert type(rebuilt.self_attention_cache) is type(cache.self_attention_cache)
    assert type(rebuilt.cross_attention_cache) is type(cache.cross_attention_cache)
    assert rebuilt.is_updated == cache.is_updated == {0: True, 1: True}
    assert rebuilt.get_seq_length() == 3 and rebuilt.cross_attention_cache.get_seq_length() == 5
    names2, tensors2, context2 = flatten.flatten_cache(rebuilt)
    assert names2 == names and context2 == context and _same_tensors(tensors2, tensors)


def test_optimum_names_in_and_out(model, model_type):
    _, out = _filled_cache(model, model_type)
    flat_in = flatten.flat_inputs({"past_key_values": out.past_key_values}, ["past_key_values"])
    assert list(flat_in) == [f"past_key_values.{n}" for n in NAMES]
    assert [k for k in flatten.flat_outputs(out) if k.startswith("present.")] == [f"present.{n}" for n in NAMES]


def test_restored_is_updated_reuses_the_cross_cache(model, model_type):
    """A rebuilt filled cache continues exactly like the original, and cross-attention reads the
    cached encoder keys/values rather than recomputing (and appending to) them."""
    inputs, out = _filled_cache(model, model_type)
    encoder_outputs = (out.encoder_last_hidden_state,)
    step = dict(attention_mask=inputs["attention_mask"], encoder_outputs=encoder_outputs,
                decoder_input_ids=torch.tensor([[5], [6]]), use_cache=True)
    names, tensors, context = flatten.flatten_cache(out.past_key_values)

    def run(leaves):
        cache = flatten.unflatten_cache(EncoderDecoderCache, context, [t.clone() for t in leaves])
        with torch.no_grad():
            return model(**step, past_key_values=cache)

    reference = run(tensors)
    assert reference.past_key_values.get_seq_length() == 4
    assert reference.past_key_values.cross_attention_cache.get_seq_length() == 5  # not appended again
    after = dict(zip(names, flatten.flatten_cache(reference.past_key_values)[1]))
    assert all(torch.equal(after[n], t) for n, t in zip(names, tensors) if ".encoder." in n)

    with torch.no_grad():
        direct = model(**step, past_key_values=flatten.clone_cache(out.past_key_values))
    torch.testing.assert_close(reference.logits, direct.logits, rtol=0, atol=0)

    zeroed = [torch.zeros_like(t) if ".encoder." in n else t for n, t in zip(names, tensors)]
    assert not torch.allclose(run(zeroed).logits, reference.logits)  # the cross cache is what is read


def test_empty_cross_cache_before_the_first_decoder_step(model, model_type):
    """As generate() builds it: layers exist but hold nothing, so there are no leaves at all."""
    cache = EncoderDecoderCache(DynamicCache(config=model.config), DynamicCache(config=model.config))
    names, tensors, context = flatten.flatten_cache(cache)
    assert names == [] and tensors == []
    _, subs, parts, is_updated = context
    assert parts == () and is_updated == tuple((i, False) for i in range(LAYERS))
    for _, (layout, layers) in subs:
        assert layout == "layers" and [initialized for *_, initialized in layers] == [False] * LAYERS
    hash(context), json.dumps(context)

    rebuilt = flatten.unflatten_cache(EncoderDecoderCache, context, [])
    assert rebuilt.is_updated == {0: False, 1: False} and rebuilt.get_seq_length() == 0
    inputs = _encoder_inputs(model_type, 2, 5, seed=0)
    start = torch.full((2, 1), CONFIGS[model_type]["decoder_start_token_id"])
    with torch.no_grad():
        first = model(**inputs, decoder_input_ids=start, past_key_values=rebuilt, use_cache=True)
        fresh = model(**inputs, decoder_input_ids=start, past_key_values=EncoderDecoderCache(
            DynamicCache(config=model.config), DynamicCache(config=model.config)), use_cache=True)
    torch.testing.assert_close(first.logits, fresh.logits, rtol=0, atol=0)
    assert flatten.flatten_cache(first.past_key_values)[0] == NAMES
    assert first.past_key_values.is_updated == {0: True, 1: True}


def test_pytree_round_trip(model, model_type):
    _, out = _filled_cache(model, model_type)
    cache = out.past_key_values
    names, tensors, _ = flatten.flatten_cache(cache)
    was_registered = flatten.is_registered(EncoderDecoderCache)
    with flatten.registered():
        assert flatten.is_registered(EncoderDecoderCache)
        leaves, spec = pytree.tree_flatten({"past_key_values": cache, "other": torch.ones(1)})
        assert len(leaves) == len(NAMES) + 1 and _same_tensors(leaves[:len(NAMES)], tensors)
        paths = [path for path, _ in pytree.tree_flatten_with_path(cache)[0]]
        assert [p[0].key for p in paths] == NAMES
        rebuilt = pytree.tree_unflatten(leaves, spec)["past_key_values"]
        assert type(rebuilt) is EncoderDecoderCache and rebuilt.is_updated == cache.is_updated
        assert _same_tensors(flatten.flatten_cache(rebuilt)[1], tensors)
        assert pytree.tree_flatten({"past_key_values": rebuilt, "other": torch.ones(1)})[1] == spec
    assert flatten.is_registered(EncoderDecoderCache) == was_registered


# (b) two observers during generate() -----------------------------------------------------------


@pytest.fixture(scope="module")
def recorded(model, model_type):
    with observe(encoder=model.get_encoder(), decoder=model.get_decoder()) as obs, torch.no_grad():
        for batch, length, seed in RUNS:
            out = model.generate(**_encoder_inputs(model_type, batch, length, seed),
                                 max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
            assert out.shape[0] == batch
    return model, obs


def test_each_observer_records_its_own_calls(recorded):
    _, obs = recorded
    assert set(obs) == {"encoder", "decoder"}
    encoder, decoder = obs["encoder"].calls, obs["decoder"].calls
    assert [tuple(c.kwargs["input_ids"].shape) for c in encoder] == [(b, n) for b, n, _ in RUNS]
    assert len(decoder) == NEW_TOKENS * len(RUNS)
    pasts = [c.kwargs[CACHE].get_seq_length() for c in decoder]
    assert pasts == list(range(NEW_TOKENS)) * len(RUNS)
    # the first step of each run sees an empty cache (no leaves), later ones all four per layer
    leaves = [list(flatten.flat_inputs(c.kwargs, [CACHE])) for c in decoder]
    full = [f"past_key_values.{n}" for n in NAMES]
    assert leaves == ([[]] + [full] * (NEW_TOKENS - 1)) * len(RUNS)
    assert all(c.kwargs[CACHE].is_updated == {i: p > 0 for i in range(LAYERS)}
               for c, p in zip(decoder, pasts))


def test_encoder_arguments(recorded):
    _, obs = recorded
    args = infer_arguments(obs["encoder"].calls, ENCODER_INPUTS)
    assert args.input_names == ENCODER_INPUTS
    assert args.dynamic_shapes == {n: {0: torch.export.Dim.DYNAMIC, 1: torch.export.Dim.DYNAMIC}
                                   for n in ENCODER_INPUTS}
    assert args.axis_names == {n: {0: "batch_size", 1: "sequence_length"} for n in ENCODER_INPUTS}
    assert tuple(args.kwargs["input_ids"].shape) == (3, 7)  # the call whose smallest dynamic axis is largest


def _decoder_arguments(obs):
    return infer_arguments(obs["decoder"].calls, DECODER_INPUTS)


def test_decoder_arguments(recorded):
    _, obs = recorded
    args = _decoder_arguments(obs)
    pkv = [f"past_key_values.{n}" for n in NAMES]
    assert args.input_names == ["input_ids", "encoder_hidden_states", "encoder_attention_mask", *pkv]
    dyn = torch.export.Dim.DYNAMIC
    assert args.dynamic_shapes["input_ids"] == {0: dyn}  # one new token per step: length 1 stays fixed
    assert args.dynamic_shapes["encoder_hidden_states"] == {0: dyn, 1: dyn}
    assert args.dynamic_shapes["encoder_attention_mask"] == {0: dyn, 1: dyn}
    assert args.dynamic_shapes[CACHE] == [{0: dyn, 2: dyn}] * len(NAMES)

    names = args.axis_names
    assert all(names[n][0] == "batch_size" for n in args.input_names)
    assert names["input_ids"] == {0: "batch_size"}
    encoder_length = names["encoder_hidden_states"][1]
    assert names["encoder_attention_mask"] == {0: "batch_size", 1: encoder_length}
    for n in pkv:
        expected = "past_decoder_sequence_length" if ".decoder." in n else encoder_length
        assert names[n] == {0: "batch_size", 2: expected}

    sample = args.kwargs
    cache = sample[CACHE]
    assert type(cache) is EncoderDecoderCache and cache.is_updated == {0: True, 1: True}
    assert sample["input_ids"].shape[0] >= 2 and sample["encoder_hidden_states"].shape[1] >= 2
    assert cache.get_seq_length() >= 2 and cache.cross_attention_cache.get_seq_length() >= 2
    assert sorted({shape[2] for shape in args.shapes[pkv[0]]}) == [1, 2, 3]  # past 0 has no leaves


def test_encoder_sequence_and_decoder_past_axes_have_optimum_names(recorded):
    names = _decoder_arguments(recorded[1]).axis_names
    assert names["encoder_hidden_states"][1] == "encoder_sequence_length"
    assert names["past_key_values.0.encoder.key"][2] == "encoder_sequence_length"
    assert names["past_key_values.0.decoder.key"][2] == "past_decoder_sequence_length"


# (c) torch.export of the decoder ---------------------------------------------------------------


def test_decoder_exports_and_runs_other_recorded_shapes(recorded):
    model, obs = recorded
    args = _decoder_arguments(obs)
    decoder = model.get_decoder()
    with flatten.registered(), patches.applied():
        program = torch.export.export(decoder, (), kwargs=args.kwargs, dynamic_shapes=args.dynamic_shapes,
                                      strict=False)
    user_inputs = [s.arg.name for s in program.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    assert len(user_inputs) == len(args.input_names)

    # another recorded step (smaller batch, encoder length and past) through the exported graph
    calls = obs["decoder"].calls
    other = next(i for i, c in enumerate(calls)
                 if i != args.sample_call and c.kwargs[CACHE].get_seq_length() == 2)
    call = calls[other]
    assert call.kwargs["input_ids"].shape[0] != args.kwargs["input_ids"].shape[0]
    kwargs = snapshot({n: call.kwargs[n] for n in args.kwargs})
    with flatten.registered(), torch.no_grad():
        got = program.module()(**kwargs)
    expected, actual = flatten.flat_outputs(call.outputs), flatten.flat_outputs(got)
    assert list(actual) == list(expected)
    assert [n for n in actual if n.startswith("present.")] == [f"present.{n}" for n in NAMES]
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=1e-5, atol=1e-5, msg=name)
