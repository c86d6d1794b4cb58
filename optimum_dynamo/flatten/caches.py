"""Flatteners for transformers' cache classes. Add one: write a flatten function, decorate it."""

from __future__ import annotations

import importlib
import inspect

import torch

from .registry import register_cache


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
    for layer_path, kwargs, initialized in layers:
        layer = _resolve(layer_path)(**dict(kwargs))
        if initialized:
            _fill_layer(layer, next(leaves), next(leaves))
        built.append(layer)
    cache.layers = built
    return cache


@register_cache("transformers.cache_utils.DynamicCache", unflatten=rebuild_dynamic)
def flatten_dynamic(cache):
    if not hasattr(cache, "layers"):
        tensors = [t for pair in zip(cache.key_cache, cache.value_cache) for t in pair]
        return _pair_names(len(cache.key_cache)), tensors, ("lists", len(cache.key_cache))
    tensors, layers = [], []
    for layer in cache.layers:
        initialized = bool(getattr(layer, "is_initialized", layer.keys is not None))
        if initialized:
            tensors += [layer.keys, layer.values]
        layers.append((_class_path(layer), _init_kwargs(layer), initialized))
    return _pair_names(len(tensors) // 2), tensors, ("layers", tuple(layers))
