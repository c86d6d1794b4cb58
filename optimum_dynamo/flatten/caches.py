"""Flatteners for transformers' cache classes. Add one: write a flatten function, decorate it."""

from __future__ import annotations

import functools
import importlib
import inspect

import torch

from .registry import flatten_cache, register_cache, unflatten_cache
from .states import RECURRENT, fill_state_layer, is_state_layer, layer_leaves


def _class_path(obj_or_cls) -> str:
    cls = obj_or_cls if isinstance(obj_or_cls, type) else type(obj_or_cls)
    return f"{cls.__module__}.{cls.__name__}"


def _resolve(path: str) -> type:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _init_kwargs(layer) -> tuple[tuple[str, int], ...]:
    """The constructor arguments of a cache layer, read back from its attributes."""
    params = inspect.signature(type(layer).__init__).parameters
    return tuple(
        (name, getattr(layer, name))
        for name, p in params.items()
        if name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and hasattr(layer, name)
    )


@functools.cache
def _layers_record_dtype() -> bool:
    """Whether the installed transformers' cache layers keep their dtype as an attribute (not before 4.56, whose
    layers record nothing of their first states, nor since 5.24)."""
    from transformers.cache_utils import DynamicLayer

    layer, empty = DynamicLayer(), torch.zeros(1, 1, 0, 1)
    init = getattr(layer, "lazy_initialization", None)
    if init is None:
        return False
    init(empty, empty) if "value_states" in inspect.signature(init).parameters else init(empty)
    return "dtype" in vars(layer)


def _place(layer, keys: torch.Tensor) -> None:
    """The device (and, where the version keeps one, the dtype) a layer's lazy initialization records."""
    layer.device = keys.device
    if _layers_record_dtype():
        layer.dtype = keys.dtype


def _fill_layer(layer, keys: torch.Tensor, values: torch.Tensor) -> None:
    _place(layer, keys)
    layer.keys, layer.values = keys, values
    layer.is_initialized = True
    if hasattr(layer, "cumulative_length"):
        layer.cumulative_length = keys.shape[-2]
    if hasattr(layer, "_sliding_window_tensor"):
        layer._sliding_window_tensor = layer._sliding_window_tensor.to(keys.device)


def _pair_names(n: int) -> list[str]:
    return [f"{i}.{part}" for i in range(n) for part in ("key", "value")]


# A sparse-attention layer (`DynamicIndexedLayer`, transformers 5: deepseek_v32, glm_moe_dsa, hy_v4, ...) also
# keeps its indexer's keys [batch, seq, index_head_dim]: leaf "N.indexer.key", after the layer's key/value.
INDEXER = "indexer.key"


def _indexer_leaves(layer) -> tuple[list[str], list[torch.Tensor]]:
    if getattr(layer, "indexer_position_ids", None) is not None:
        raise TypeError(f"{type(layer).__name__} with indexer positions (indexer_position_ids) cannot be flattened")
    initialized = bool(layer.is_indexer_initialized)
    return ([INDEXER], [layer.indexer_keys]) if initialized else ([], [])


def _fill_indexer(layer, leaves) -> None:
    keys = next(leaves)
    layer.indexer_keys, layer.is_indexer_initialized = keys, True
    layer.indexer_dtype, layer.indexer_device = keys.dtype, keys.device


def rebuild_dynamic(cls, context, tensors):
    layout, layers = context
    cache = cls()
    if layout == "lists":  # transformers < 4.54: key_cache / value_cache lists
        cache.key_cache, cache.value_cache = list(tensors[0::2]), list(tensors[1::2])
        if hasattr(cache, "_seen_tokens") and tensors:
            cache._seen_tokens = tensors[0].shape[-2]
        return cache
    leaves = iter(tensors)
    built = []
    for layer_path, kwargs, initialized, *extras in layers:
        layer = _resolve(layer_path)(**dict(kwargs))
        if initialized:
            _fill_layer(layer, next(leaves), next(leaves))
        for kind, extra in extras:
            if kind == "states":  # a linear-attention layer (transformers >= 5)
                fill_state_layer(layer, extra, leaves)
            elif extra:  # an initialized indexer
                _fill_indexer(layer, leaves)
        built.append(layer)
    cache.layers = built
    return cache


@register_cache("transformers.cache_utils.DynamicCache", unflatten=rebuild_dynamic)
def flatten_dynamic(cache):
    if not hasattr(cache, "layers"):
        tensors = [t for pair in zip(cache.key_cache, cache.value_cache) for t in pair]
        return _pair_names(len(cache.key_cache)), tensors, ("lists", len(cache.key_cache))
    names, tensors, layers = [], [], []
    for i, layer in enumerate(cache.layers):
        keys = getattr(layer, "keys", None)
        initialized = keys is not None and bool(getattr(layer, "is_initialized", True))
        if initialized:
            names += [f"{i}.key", f"{i}.value"]
            tensors += [keys, layer.values]
        entry = (_class_path(layer), _init_kwargs(layer), initialized)
        if is_state_layer(layer):  # linear-attention states (transformers >= 5), after its keys/values
            state_names, states, state_context = layer_leaves(layer)
            names += [f"{i}.{n}" for n in state_names]
            tensors += states
            entry += (("states", state_context),)
        if hasattr(layer, "indexer_keys"):
            indexer_names, indexer = _indexer_leaves(layer)
            names += [f"{i}.{n}" for n in indexer_names]
            tensors += indexer
            entry += (("indexer", bool(indexer)),)
        layers.append(entry)
    return names, tensors, ("layers", tuple(layers))


# EncoderDecoderCache: a self-attention cache ("decoder") and a cross-attention cache ("encoder").
# Leaves per layer in optimum's seq2seq order: "{i}.decoder.key", "{i}.decoder.value",
# "{i}.encoder.key", "{i}.encoder.value". Each sub-cache is flattened by its own registered
# flattener (DynamicCache: `flatten_dynamic`), so a still-empty cross cache (before the first
# decoder step) gives no encoder leaves, like uninitialized DynamicCache layers.

_SEQ2SEQ_PARTS = (("self_attention_cache", "decoder"), ("cross_attention_cache", "encoder"))


def _split_leaf(leaf: str) -> tuple[int, str]:
    """``"3.key"`` -> ``(3, "key")``."""
    index, _, rest = leaf.partition(".")
    if not index.isdigit() or not rest:
        raise ValueError(f"sub-cache leaf {leaf!r} is not named '<layer>.<name>'")
    return int(index), rest


def rebuild_encoder_decoder(cls, context, tensors):
    _, subs, parts, is_updated = context
    caches = {}
    for (attr, part), (sub_path, sub_context) in zip(_SEQ2SEQ_PARTS, subs):
        mine = [t for t, owner in zip(tensors, parts) if owner == part]
        caches[attr] = unflatten_cache(_resolve(sub_path), sub_context, mine)
    cache = cls(caches["self_attention_cache"], caches["cross_attention_cache"])
    # Whether each layer's cross-attention keys/values are already computed: the attention
    # layers reuse the cross cache instead of recomputing it when this is True.
    cache.is_updated = dict(is_updated)
    return cache


@register_cache("transformers.cache_utils.EncoderDecoderCache", unflatten=rebuild_encoder_decoder)
def flatten_encoder_decoder(cache):
    leaves, subs = [], []
    for order, (attr, part) in enumerate(_SEQ2SEQ_PARTS):
        sub = getattr(cache, attr)
        names, tensors, sub_context = flatten_cache(sub)
        subs.append((_class_path(sub), sub_context))
        for position, (name, tensor) in enumerate(zip(names, tensors)):
            layer, rest = _split_leaf(name)
            leaves.append(((layer, order, position), f"{layer}.{part}.{rest}", part, tensor))
    leaves.sort(key=lambda leaf: leaf[0])  # layer by layer, decoder before encoder
    is_updated = tuple(sorted((int(i), bool(v)) for i, v in getattr(cache, "is_updated", {}).items()))
    context = ("encoder_decoder", tuple(subs), tuple(leaf[2] for leaf in leaves), is_updated)
    return [leaf[1] for leaf in leaves], [leaf[3] for leaf in leaves], context


# StaticCache (transformers >= 4.54: a list of StaticLayer / StaticSlidingWindowLayer).
# Leaves per initialized layer: "{i}.key", "{i}.value", and "{i}.cumulative_length" where the
# layer keeps its write position as a tensor (transformers 5). A sliding layer's python-int
# position (`cumulative_length` in 4.x, `cumulative_length_int` in 5.x) and each layer's
# `max_cache_len` (already min(window, max_cache_len) for sliding layers) go in the context.
# The deprecated 4.x subclasses (SlidingWindowCache, HybridCache, ...) hold the same layers.

_STATIC_INTS = ("cumulative_length", "cumulative_length_int", "_is_croppable")  # the last: a bool (5.24)


def _static_leaves(layer) -> list[tuple[str, torch.Tensor]]:
    leaves = [("key", layer.keys), ("value", layer.values)]
    if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor):
        leaves.append(("cumulative_length", layer.cumulative_length))
    return leaves


def rebuild_static(cls, context, tensors):
    from transformers.cache_utils import Cache

    leaves, built = iter(tensors), []
    for layer_path, max_cache_len, initialized, ints, parts in context[1]:
        layer_cls = _resolve(layer_path)
        kwargs = {"max_cache_len": max_cache_len}
        if "sliding_window" in inspect.signature(layer_cls.__init__).parameters:
            kwargs["sliding_window"] = max_cache_len  # the stored length is already the window
        layer = layer_cls(**kwargs)
        for name, value in ints:
            setattr(layer, name, value)
        if initialized:
            state = {part: next(leaves) for part in parts}
            keys, values = state["key"], state["value"]
            layer.keys, layer.values = keys, values
            _place(layer, keys)
            if "cumulative_length" in state:
                layer.cumulative_length = state["cumulative_length"]
            # shape attributes lazy_initialization would have set (names differ across versions)
            batch, heads, _, head_dim = keys.shape
            if "value_states" in inspect.signature(layer_cls.lazy_initialization).parameters:  # 5.x
                layer.batch_size, layer.num_heads = batch, heads
                layer.k_head_dim, layer.v_head_dim = head_dim, values.shape[-1]
            else:
                layer.max_batch_size, layer.num_heads, layer.head_dim = batch, heads, head_dim
            layer.is_initialized = True
        built.append(layer)
    cache = cls.__new__(cls)
    Cache.__init__(cache, layers=built)
    return cache


@register_cache("transformers.cache_utils.StaticCache", unflatten=rebuild_static)
@register_cache("transformers.cache_utils.SlidingWindowCache", unflatten=rebuild_static)
@register_cache("transformers.cache_utils.HybridCache", unflatten=rebuild_static)
@register_cache("transformers.cache_utils.HybridChunkedCache", unflatten=rebuild_static)
def flatten_static(cache):
    if not hasattr(cache, "layers"):
        raise TypeError(f"{type(cache).__name__} of transformers < 4.54 (key_cache lists) cannot be flattened")
    names, tensors, layers = [], [], []
    for i, layer in enumerate(cache.layers):
        initialized = bool(getattr(layer, "is_initialized", False))
        parts = ()
        if initialized:
            leaves = _static_leaves(layer)
            names += [f"{i}.{part}" for part, _ in leaves]
            tensors += [t for _, t in leaves]
            parts = tuple(part for part, _ in leaves)
        ints = tuple((n, getattr(layer, n)) for n in _STATIC_INTS if type(getattr(layer, n, None)) in (int, bool))
        layers.append((_class_path(layer), layer.max_cache_len, initialized, ints, parts))
    return names, tensors, ("static", tuple(layers))


# transformers 5 MiniMax: a DynamicCache (attention layers) plus `linear_cache`, one lightning-attention state
# per linear layer (`[]` for the others). Leaves in layer order; the context says which leaf is which.
def rebuild_minimax(cls, context, tensors):
    dynamic_context, kinds, has_state = context
    dynamic = [t for t, kind in zip(tensors, kinds) if kind == "kv"]
    states = iter(t for t, kind in zip(tensors, kinds) if kind == RECURRENT)
    cache = rebuild_dynamic(cls, dynamic_context, dynamic)
    cache.linear_cache = [next(states) if has else [] for has in has_state]
    return cache


@register_cache("transformers.models.minimax.modeling_minimax.MiniMaxCache", unflatten=rebuild_minimax)
def flatten_minimax(cache):
    names, tensors, dynamic_context = flatten_dynamic(cache)
    leaves = [(int(n.split(".")[0]), n, t, "kv") for n, t in zip(names, tensors)]
    has_state = tuple(isinstance(s, torch.Tensor) for s in cache.linear_cache)
    leaves += [(i, f"{i}.{RECURRENT}", s, RECURRENT) for i, s in enumerate(cache.linear_cache) if has_state[i]]
    leaves.sort(key=lambda leaf: leaf[0])  # stable: keys/values before a state of the same layer
    return ([n for _, n, _, _ in leaves], [t for _, _, t, _ in leaves],
            (dynamic_context, tuple(k for *_, k in leaves), has_state))
