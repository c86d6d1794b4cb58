"""Sliding-window cache layers, exported bounded the way eager bounds them.

Eager `DynamicSlidingWindowLayer` keeps the last `sliding_window - 1` positions and branches on an int
count of the tokens seen (`cumulative_length`). In the graph the count is symbolic: `seen_tokens_hook`
sets it from the inputs' shapes (`attention_mask` length minus the new tokens), and these replacements
compute the mask sizes and the kept slice from shapes, with no branch:

- kept positions: the last `min(past + new, sliding_window - 1)`;
- mask: `kv_length = past + new`, `kv_offset = seen - past` (the absolute position of the first kept key).

Both equal eager's values for every count (eager's `max(seen - window + 1, 0)` is `seen - past`).
"""

from __future__ import annotations

import inspect
from contextlib import contextmanager

import torch

from legacy_bridge import cache_argument

from .registry import register_patch

_LAYER = "transformers.cache_utils.DynamicSlidingWindowLayer"
_REASON = "bounded sliding-window cache: sizes from shapes, not from a Python int"


def _past(layer) -> int:
    return layer.keys.shape[-2] if getattr(layer, "is_initialized", False) else 0


def _keep_window(layer, key_states, value_states):
    """Concatenate past and new states, keep the window's tail, return the full states."""
    keys = torch.cat([layer.keys, key_states], dim=-2)
    values = torch.cat([layer.values, value_states], dim=-2)
    kept = torch.sym_min(keys.shape[-2], layer.sliding_window - 1)
    start = keys.shape[-2] - kept
    layer.keys, layer.values = keys.narrow(-2, start, kept), values.narrow(-2, start, kept)
    layer.cumulative_length = layer.cumulative_length + key_states.shape[-2]
    return keys, values


def _initialize(layer, key_states, value_states):
    """transformers 5 initializes a layer from keys and values, 4 from keys."""
    if not layer.is_initialized:
        takes_values = len(inspect.signature(layer.lazy_initialization).parameters) > 1
        layer.lazy_initialization(*((key_states, value_states) if takes_values else (key_states,)))


@register_patch(f"{_LAYER}.update", versions={"transformers": ">=4.56,<5.4"}, reason=_REASON)
def update_cache_kwargs(self, key_states, value_states, cache_kwargs=None):
    _initialize(self, key_states, value_states)
    return _keep_window(self, key_states, value_states)


@register_patch(f"{_LAYER}.get_mask_sizes", versions={"transformers": ">=4.56,<5.4"}, reason=_REASON)
def get_mask_sizes_from_positions(self, cache_position):
    past = _past(self)
    return past + cache_position.shape[0], self.cumulative_length - past


@register_patch(f"{_LAYER}.update", versions={"transformers": ">=5.4"}, reason=_REASON)
def update(self, key_states, value_states, *args, **kwargs):
    _initialize(self, key_states, value_states)
    return _keep_window(self, key_states, value_states)


@register_patch(f"{_LAYER}.get_mask_sizes", versions={"transformers": ">=5.4"}, reason=_REASON)
def get_mask_sizes(self, query_length):
    past = _past(self)
    return past + query_length, self.cumulative_length - past


def sliding_layers(cache) -> list[int]:
    """Indices of the bounded sliding-window layers of a cache (empty for other caches)."""
    layers = getattr(cache, "layers", None) or ()
    return [i for i, layer in enumerate(layers) if getattr(layer, "is_sliding", False) and hasattr(layer, "sliding_window")]


def _seen_tokens(module, args, kwargs):
    cache, mask = cache_argument.of(kwargs), kwargs.get("attention_mask")
    new = kwargs.get("input_ids") if kwargs.get("input_ids") is not None else kwargs.get("inputs_embeds")
    if cache is None or mask is None or mask.dim() != 2 or new is None:
        return None
    for i in sliding_layers(cache):
        cache.layers[i].cumulative_length = mask.shape[-1] - new.shape[1]
    return None


@contextmanager
def seen_tokens_hook(model: torch.nn.Module):
    """While tracing `model`, tell each sliding layer how many tokens came before (from the mask's length).
    Without an `attention_mask` the layers count only the positions they hold: relative positions, and so
    the window, stay right; padding is then not masked anyway."""
    handle = model.register_forward_pre_hook(_seen_tokens, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()
