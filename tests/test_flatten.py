"""The cache registry: round trips, optimum names, reversible pytree/optree registration."""

import contextlib
import logging

import optree
import pytest
import torch
import torch.fx._pytree as fx_pytree
import torch.utils._pytree as pytree
from transformers import DynamicCache

from optimum_dynamo import flatten
from optimum_dynamo.flatten.caches import rebuild_dynamic


def _cache(layers=3, batch=2, past=5):
    cache = DynamicCache()
    for i in range(layers):
        cache.update(torch.randn(batch, 2, past, 4), torch.randn(batch, 2, past, 4), i)
    return cache


def _tensors(cache):
    return flatten.flatten_cache(cache)[1]


def test_round_trip_keeps_tensors_and_names():
    cache = _cache()
    names, tensors, context = flatten.flatten_cache(cache)
    assert names == ["0.key", "0.value", "1.key", "1.value", "2.key", "2.value"]
    rebuilt = flatten.unflatten_cache(DynamicCache, context, tensors)
    assert type(rebuilt) is DynamicCache and rebuilt.get_seq_length() == 5
    assert all(torch.equal(a, b) for a, b in zip(_tensors(rebuilt), tensors))
    assert flatten.flatten_cache(rebuilt)[0] == names


def test_legacy_list_layout_round_trip():
    """transformers < 4.54 kept key_cache / value_cache lists: same leaves, same names."""
    keys, values = [torch.randn(1, 2, 3, 4) for _ in range(2)], [torch.randn(1, 2, 3, 4) for _ in range(2)]
    cache = rebuild_dynamic(DynamicCache, ("lists", 2), [keys[0], values[0], keys[1], values[1]])
    assert cache.key_cache[1] is keys[1] and cache.value_cache[0] is values[0]


@pytest.mark.skipif(not hasattr(DynamicCache(), "layers"), reason="transformers < 4.54 has no cache layers")
def test_sliding_window_layers_round_trip():
    from tiny import tiny_config

    cache = DynamicCache(config=tiny_config("gemma2", sliding_window=6))
    for i in range(2):
        cache.update(torch.randn(1, 2, 4, 16), torch.randn(1, 2, 4, 16), i)
    names, tensors, context = flatten.flatten_cache(cache)
    rebuilt = flatten.unflatten_cache(DynamicCache, context, tensors)
    assert [type(layer) for layer in rebuilt.layers] == [type(layer) for layer in cache.layers]
    assert [getattr(layer, "sliding_window", None) for layer in rebuilt.layers] == [
        getattr(layer, "sliding_window", None) for layer in cache.layers
    ]


def test_optimum_names():
    assert flatten.input_name("past_key_values", "3.key") == "past_key_values.3.key"
    assert flatten.output_name("past_key_values", "3.value") == "present.3.value"
    out = {"logits": torch.zeros(1), "past_key_values": _cache(layers=1)}
    assert list(flatten.flat_outputs(out)) == ["logits", "present.0.key", "present.0.value"]


def test_clone_is_independent_of_later_updates():
    cache = _cache(layers=1, past=2)
    copy = flatten.clone_cache(cache)
    cache.update(torch.randn(2, 2, 1, 4), torch.randn(2, 2, 1, 4), 0)
    assert copy.get_seq_length() == 2 and cache.get_seq_length() == 3


def _node_fns(cls):
    node = pytree.SUPPORTED_NODES.get(cls)
    return None if node is None else (node.flatten_fn, node.unflatten_fn, node.flatten_with_keys_fn)


def test_registration_reaches_pytree_and_optree_and_is_reversible():
    before = _node_fns(DynamicCache)  # transformers < 4.54 registers it itself
    fx_before = fx_pytree.SUPPORTED_NODES.get(DynamicCache)
    cache = _cache(layers=2)
    with flatten.registered():
        leaves, spec = pytree.tree_flatten({"past_key_values": cache})
        assert len(leaves) == 4
        assert len(optree.tree_leaves(cache, namespace="torch", none_is_leaf=True)) == 4
        assert spec.children_specs[0].context[0] == ("0.key", "0.value", "1.key", "1.value")  # ours
        rebuilt = pytree.tree_unflatten(leaves, spec)["past_key_values"]
        assert rebuilt.get_seq_length() == 5
        with flatten.registered():  # nested use keeps it registered
            pass
        assert flatten.is_registered(DynamicCache)
    assert _node_fns(DynamicCache) == before
    assert fx_pytree.SUPPORTED_NODES.get(DynamicCache) is fx_before
    if before is None:
        assert optree.tree_leaves(cache, namespace="torch") == [cache]


def test_previous_registration_is_restored():
    def flat(c):
        return [], None

    def unflat(values, context):
        return DynamicCache()

    original = _node_fns(DynamicCache)
    if original is not None:  # transformers registered it: that registration is the one to restore
        with flatten.registered():
            assert _node_fns(DynamicCache) != original
        assert _node_fns(DynamicCache) == original
        return
    pytree.register_pytree_node(DynamicCache, flat, unflat, serialized_type_name="someone.else.DynamicCache")
    try:
        with flatten.registered():
            assert len(pytree.tree_leaves(_cache(layers=1))) == 2
        assert pytree.SUPPORTED_NODES[DynamicCache].flatten_fn is flat
        assert pytree.tree_leaves(_cache(layers=1)) == []
    finally:
        pytree._deregister_pytree_node(DynamicCache)
        with contextlib.suppress(ValueError):  # torch >= 2.15 deregisters from optree itself
            optree.unregister_pytree_node(DynamicCache, namespace="torch")


def test_unknown_cache_class_is_an_error():
    class MyCache:
        pass

    with pytest.raises(TypeError, match="no flattening registered"):
        flatten.flatten_cache(MyCache())


def test_exported_program_with_a_cache_input_survives_save_and_load(tmp_path):
    class LastKeys(torch.nn.Module):
        def forward(self, past_key_values):
            return past_key_values.key_cache[-1] * 2 if not hasattr(past_key_values, "layers") else (
                past_key_values.layers[-1].keys * 2
            )

    cache = _cache(layers=2)
    with flatten.registered():
        program = torch.export.export(LastKeys(), (cache,), strict=False)
        torch.export.save(program, tmp_path / "program.pt2")
        # torch 2.13 logs a warning with a broken format string when the example inputs need
        # weights_only=False; pytest's log capture turns that into an error, so quiet that logger.
        serde_log = logging.getLogger("torch._export.serde.serialize")
        level, serde_log.level = serde_log.level, logging.ERROR
        try:
            loaded = torch.export.load(tmp_path / "program.pt2")
        finally:
            serde_log.setLevel(level)
        other = _cache(layers=2)
        assert torch.equal(loaded.module()(other), _tensors(other)[-2] * 2)
