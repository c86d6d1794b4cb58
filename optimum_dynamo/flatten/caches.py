"""Flatteners for transformers' cache classes. Add one: write a flatten function, decorate it."""

from __future__ import annotations

import importlib
import inspect

import torch

from .registry import flatten_cache, register_cache, unflatten_cache
from .states import fill_state_layer, is_state_layer, layer_leaves


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


def _fill_layer(layer, keys: torch.Tensor, values: torch.Tensor) -> None:
    layer.dtype, layer.device = keys.dtype, keys.device
    layer.keys, layer.values = keys, values
    layer.is_initialized = True
    if hasattr(layer, "cumulative_length"):
        layer.cumulative_length = keys.shape[-2]
    if hasattr(layer, "_sliding_window_tensor"):
        layer._sliding_window_tensor = layer._sliding_window_tensor.to(keys.device)


def _pair_names(n: int) -> list[str]:
    return [f"{i}.{part}" for i in range(n) for part in ("key", "value")]


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
    for layer_path, kwargs, initialized, *states in layers:
        layer = _resolve(layer_path)(**dict(kwargs))
        if initialized:
            _fill_layer(layer, next(leaves), next(leaves))
        if states:  # a linear-attention layer (transformers >= 5)
            fill_state_layer(layer, states[0], leaves)
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
            entry += (state_context,)
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
