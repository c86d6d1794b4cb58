"""Every registered cache class, in the layouts the installed transformers builds: flatten -> unflatten
gives the same tensors, the same (exact) leaf names, the same layer classes and layer attributes, also
through torch pytree and optree while registered; a StaticCache input survives torch.export."""

import optree
import pytest
import torch
import torch.utils._pytree as pytree
import transformers
from transformers import DynamicCache, EncoderDecoderCache, StaticCache, cache_utils

from optimum_dynamo import flatten
from tiny import tiny_config

T5 = int(transformers.__version__.split(".")[0]) >= 5
LAYERED = hasattr(DynamicCache(), "layers")  # transformers >= 4.54
needs_layers = pytest.mark.skipif(not LAYERED, reason="transformers < 4.54: caches have no layers and no config")
WINDOW = 4
HEAD = 16


def _fill(cache, layers, steps, batch=2, heads=2):
    """Prefill then decode steps through the cache's own `update`, as attention layers do."""
    position = 0
    for n in steps:
        kwargs = {"cache_position": torch.arange(position, position + n)}
        for i in range(layers):
            cache.update(torch.randn(batch, heads, n, HEAD), torch.randn(batch, heads, n, HEAD), i, kwargs)
        position += n
    return cache


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    return a == b


def _assert_same_state(cache, rebuilt):
    assert type(rebuilt) is type(cache)
    if not hasattr(cache, "layers"):
        return
    assert [type(layer) for layer in rebuilt.layers] == [type(layer) for layer in cache.layers]
    for old, new in zip(cache.layers, rebuilt.layers):
        assert sorted(vars(new)) == sorted(vars(old)), type(old).__name__
        different = [k for k, v in vars(old).items() if not _same(v, vars(new)[k])]
        assert not different, f"{type(old).__name__}: {different} differ after the round trip"


def _round_trip(cache, names):
    got_names, tensors, context = flatten.flatten_cache(cache)
    assert got_names == names
    rebuilt = flatten.unflatten_cache(type(cache), context, tensors)
    again_names, again, again_context = flatten.flatten_cache(rebuilt)
    assert again_names == names and again_context == context
    assert all(_same(a, b) for a, b in zip(again, tensors))
    with flatten.registered():
        leaves, spec = pytree.tree_flatten(cache)
        assert len(leaves) == len(names) and all(a is b for a, b in zip(leaves, tensors))
        assert [str(path[0]) for path, _ in pytree.tree_flatten_with_path(cache)[0]] == [f"[{n!r}]" for n in names]
        from_pytree = pytree.tree_unflatten(leaves, spec)
        o_leaves, o_spec = optree.tree_flatten(cache, namespace="torch", none_is_leaf=True)
        assert len(o_leaves) == len(names)
        from_optree = optree.tree_unflatten(o_spec, o_leaves)
    for other in (rebuilt, from_pytree, from_optree):
        _assert_same_state(cache, other)
    return rebuilt


def _pairs(n):
    return [f"{i}.{part}" for i in range(n) for part in ("key", "value")]


def test_dynamic_cache():
    _round_trip(_fill(DynamicCache(), 3, [5, 1]), _pairs(3))


@needs_layers
@pytest.mark.parametrize("model_type", ["mistral", "gemma2"])  # all-sliding; sliding + full (hybrid)
def test_dynamic_cache_with_sliding_layers(model_type):
    config = tiny_config(model_type, sliding_window=WINDOW, head_dim=HEAD)
    cache = _fill(DynamicCache(config=config), 2, [3])  # within the window
    assert type(cache.layers[0]).__name__ == "DynamicSlidingWindowLayer"
    _round_trip(cache, _pairs(2))


@needs_layers
def test_dynamic_sliding_layer_past_the_window():
    """Past the window, the count of tokens seen is not in the leaves (the kept keys are `window - 1`):
    a rebuilt layer counts the positions it holds, and an export takes the count from the attention
    mask's length instead (tests/test_sliding_window.py). Copies made by `clone_cache` keep it."""
    cache = _fill(DynamicCache(config=tiny_config("mistral", sliding_window=WINDOW, head_dim=HEAD)), 2, [5, 1, 1])
    assert cache.layers[0].cumulative_length == 7 and cache.layers[0].keys.shape[-2] == WINDOW - 1
    names, tensors, context = flatten.flatten_cache(cache)
    assert names == _pairs(2)
    rebuilt = flatten.unflatten_cache(type(cache), context, tensors)
    assert all(torch.equal(a, b) for a, b in zip(flatten.flatten_cache(rebuilt)[1], tensors))
    assert rebuilt.layers[0].cumulative_length == WINDOW - 1
    _assert_same_state(cache, flatten.clone_cache(cache))


def test_encoder_decoder_cache():
    cache = EncoderDecoderCache(_fill(DynamicCache(), 2, [3, 1]), _fill(DynamicCache(), 2, [6]))
    cache.is_updated = {0: True, 1: True}
    names = [f"{i}.{part}.{kv}" for i in range(2) for part in ("decoder", "encoder") for kv in ("key", "value")]
    _round_trip(cache, names)


def test_encoder_decoder_cache_before_cross_attention():
    cache = EncoderDecoderCache(_fill(DynamicCache(), 2, [3]), DynamicCache())
    _round_trip(cache, [f"{i}.decoder.{kv}" for i in range(2) for kv in ("key", "value")])


def _static_names(n):
    parts = ("key", "value", "cumulative_length") if T5 else ("key", "value")  # 5.x: a tensor write position
    return [f"{i}.{part}" for i in range(n) for part in parts]


@needs_layers
@pytest.mark.parametrize(
    "model_type, sliding",
    [("llama", [False, False]), ("mistral", [True, True]), ("gemma2", [True, False])],  # full, sliding, hybrid
)
@pytest.mark.parametrize("steps", [[3], [5, 1, 1]], ids=["within-window", "past-window"])
def test_static_cache(model_type, sliding, steps):
    window = {"sliding_window": WINDOW} if any(sliding) else {}
    config = tiny_config(model_type, head_dim=HEAD, **window)
    cache = _fill(StaticCache(config=config, max_cache_len=10), 2, steps)
    assert [layer.is_sliding for layer in cache.layers] == sliding
    rebuilt = _round_trip(cache, _static_names(2))
    assert rebuilt.get_seq_length() == cache.get_seq_length()
    assert [layer.max_cache_len for layer in rebuilt.layers] == [WINDOW if s else 10 for s in sliding]
    # a rebuilt copy (own tensors: updates are in place) continues like the original
    rebuilt = flatten.clone_cache(cache)
    for c in (cache, rebuilt):
        torch.manual_seed(1)
        _fill(c, 2, [1])
    _assert_same_state(cache, rebuilt)


@needs_layers
def test_uninitialized_static_cache_has_no_leaves():
    cache = StaticCache(config=tiny_config("gemma2", sliding_window=WINDOW, head_dim=HEAD), max_cache_len=10)
    _round_trip(cache, [])


@needs_layers
def test_export_with_a_static_cache_input_matches_eager():
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    config = tiny_config("llama")
    model = AutoModelForCausalLM.from_config(config).eval()

    def prefilled():
        cache = StaticCache(config=config, max_cache_len=16)
        with torch.no_grad():
            model(input_ids=torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]]), past_key_values=cache,
                  cache_position=torch.arange(4), use_cache=True)
        return cache

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, cache_position, past_key_values):
            return self.model(input_ids=input_ids, cache_position=cache_position, past_key_values=past_key_values,
                              use_cache=True).logits

    ids, position = torch.tensor([[13], [14]]), torch.tensor([4])
    with flatten.registered():
        program = torch.export.export(Step(), (ids, position, prefilled()), strict=False)
        names = [s.arg.name for s in program.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
        assert names[2:] == ["past_key_values_" + n.replace(".", "_") for n in _static_names(2)]
        eager_cache, exported_cache = prefilled(), prefilled()
        with torch.no_grad():
            expected = model(input_ids=ids, cache_position=position, past_key_values=eager_cache, use_cache=True).logits
            got = program.module()(ids, position, exported_cache)
    assert (got - expected).abs().max().item() < 1e-5
    # the program writes the new keys/values (and 5.x's write position) into the cache it is given
    for a, b in zip(flatten.flatten_cache(exported_cache)[1], flatten.flatten_cache(eager_cache)[1]):
        assert torch.allclose(a, b, atol=1e-5)


@needs_layers
def test_minimax_cache():
    """MiniMax: a DynamicCache for its attention layers plus one lightning-attention state per linear layer;
    leaves in layer order."""
    from transformers.models.minimax.modeling_minimax import MiniMaxCache

    cache = MiniMaxCache()
    for step in range(2):
        cache.set_linear_cache(0, torch.randn(2, 4, HEAD, HEAD))
        cache.update(torch.randn(2, 2, 3 - 2 * step, HEAD), torch.randn(2, 2, 3 - 2 * step, HEAD), 1,
                     {"cache_position": torch.arange(3 * step, 3 + step)})
        cache.set_linear_cache(2, torch.randn(2, 4, HEAD, HEAD))
    rebuilt = _round_trip(cache, ["0.recurrent_state", "1.key", "1.value", "2.recurrent_state"])
    assert [torch.equal(a, b) for a, b in zip(rebuilt.linear_cache[::2], cache.linear_cache[::2])] == [True, True]
    assert rebuilt.linear_cache[1] == []


@pytest.mark.skipif(not hasattr(cache_utils, "DynamicIndexedLayer"), reason="no DynamicIndexedLayer (transformers 5)")
def test_dynamic_cache_with_indexed_layers():
    """Sparse attention (transformers 5: hy_v4, deepseek_v32, ...): an indexed layer also keeps its indexer's
    keys [batch, seq, dim] (leaf "N.indexer.key"); a layer that reuses another's top-k has none."""
    cache = DynamicCache()
    cache.layers = [cache_utils.DynamicIndexedLayer(), cache_utils.DynamicIndexedLayer()]
    for n in (3, 1):
        for i in range(2):
            cache.update(torch.randn(2, 1, n, HEAD), torch.randn(2, 1, n, 8), i)
        cache.update_indexer(torch.randn(2, n, 32), 0)
    rebuilt = _round_trip(cache, ["0.key", "0.value", "0.indexer.key", "1.key", "1.value"])
    assert rebuilt.layers[0].indexer_keys.shape == (2, 4, 32) and rebuilt.layers[1].indexer_keys is None
    assert torch.equal(rebuilt.update_indexer(torch.zeros(2, 1, 32), 0)[:, :4], cache.layers[0].indexer_keys)


def test_state_list():
    """A model's state as a plain list of tensors (RWKV), captured as a `StateList`: one group of states."""
    from optimum_dynamo.flatten.states import StateList

    cache = StateList(torch.randn(2, 8, 3) for _ in range(5))
    rebuilt = _round_trip(cache, ["0.recurrent_state", *[f"0.recurrent_state_{i}" for i in range(1, 5)]])
    assert isinstance(rebuilt, list) and len(rebuilt) == 5


def test_mamba2_cache():
    """transformers 4's Mamba2Cache: one stacked tensor per kind, a leaf per layer and kind. The rebuilt cache holds
    those very leaves (torch.export marks dynamic axes on the tensors it flattened, then flattens again to fakify
    them: fresh `unbind` views would fix the batch) and updates them as the stacked cache does."""
    from transformers.models.mamba2 import modeling_mamba2

    if not hasattr(modeling_mamba2, "Mamba2Cache"):
        pytest.skip("transformers >= 5 keeps Mamba-2 states in DynamicCache")
    cache = modeling_mamba2.Mamba2Cache(tiny_config("mamba2"), 2, dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    cache.conv_states.copy_(torch.randn(cache.conv_states.shape, generator=g))
    cache.ssm_states.copy_(torch.randn(cache.ssm_states.shape, generator=g))
    names = [f"{i}.{part}" for i in range(2) for part in ("conv_state", "recurrent_state")]
    got_names, tensors, context = flatten.flatten_cache(cache)
    assert got_names == names and [t.shape[0] for t in tensors] == [2] * 4
    rebuilt = _round_trip(flatten.unflatten_cache(type(cache), context, [t.clone() for t in tensors]), names)
    for kind in ("conv_states", "ssm_states"):
        assert torch.equal(torch.stack(list(getattr(rebuilt, kind))), getattr(cache, kind))
    conv, ssm = torch.randn(2, 1, cache.conv_states.shape[2], generator=g), torch.randn(cache.ssm_states.shape[1:])
    for c in (cache, rebuilt):
        c.update_conv_state(1, conv, cache_init=False)
        c.update_ssm_state(0, ssm)
    assert all(torch.equal(a, b) for a, b in zip(flatten.flatten_cache(rebuilt)[1], flatten.flatten_cache(cache)[1]))
    rebuilt.reset()
    assert all(not t.any() for t in flatten.flatten_cache(rebuilt)[1])


def test_zamba2_cache():
    """transformers 4's Zamba2HybridDynamicCache: states in dicts by layer (every layer has a mamba block),
    keys and values of the hybrid layers in lists, `[batch, 0]` placeholders elsewhere (not leaves). The rebuilt
    cache keeps the dicts and updates as the original does."""
    from transformers.models.zamba2 import modeling_zamba2

    if not hasattr(modeling_zamba2, "Zamba2HybridDynamicCache"):
        pytest.skip("transformers >= 5 keeps Zamba2's states in DynamicCache")
    config = tiny_config("zamba2")
    cache = modeling_zamba2.Zamba2HybridDynamicCache(config, 2, dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    for states in (cache.conv_states, cache.ssm_states):
        for t in states.values():
            t.copy_(torch.randn(t.shape, generator=g))
    hybrid = cache.transformer_layers[0]
    cache.update(torch.randn(2, 4, 3, HEAD, generator=g), torch.randn(2, 4, 3, HEAD, generator=g), hybrid)
    names = [f"{i}.{leaf}" for i in range(config.num_hidden_layers)
             for leaf in (("key", "value") if i == hybrid else ()) + ("conv_state", "recurrent_state")]
    rebuilt = _round_trip(cache, names)
    assert type(rebuilt.conv_states) is dict and type(rebuilt.ssm_states) is dict
    assert [tuple(t.shape) for i, t in enumerate(rebuilt.key_cache) if i != hybrid] == [(2, 0)] * 2
    assert rebuilt.get_seq_length() == 3 and rebuilt.has_previous_state == cache.has_previous_state
    step = torch.randn(2, 4, 1, HEAD, generator=g)
    assert torch.equal(rebuilt.update(step, step, hybrid)[0], cache.update(step, step, hybrid)[0])
