"""Flat, named views of call inputs and outputs (caches expanded with optimum's names)."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from .naming import input_name, output_name
from .registry import flatten_cache, is_cache


def flat_inputs(kwargs: dict[str, Any], names: Sequence[str]) -> dict[str, torch.Tensor]:
    """Tensors of `kwargs[name]` for each name, caches expanded (`past_key_values.0.key`)."""
    flat: dict[str, torch.Tensor] = {}
    for name in names:
        value = kwargs.get(name)
        if isinstance(value, torch.Tensor):
            flat[name] = value
        elif is_cache(value):
            leaves, tensors, _ = flatten_cache(value)
            flat.update((input_name(name, leaf), t) for leaf, t in zip(leaves, tensors))
        elif value is not None and not isinstance(value, (bool, int, float, str)):
            raise TypeError(
                f"input {name!r} is a {type(value).__module__}.{type(value).__qualname__}, which has no registered "
                "flattening: its tensors would be lost. Register the class with @register_cache "
                "(optimum_dynamo/flatten/caches.py or states.py)."
            )
    return flat


def bounded_inputs(kwargs: dict[str, Any], names: Sequence[str]) -> set[str]:
    """Flat names of cache leaves whose length is bounded (sliding-window layers keep `window - 1`)."""
    bounded = set()
    for name in names:
        layers = getattr(kwargs.get(name), "layers", None)
        if not is_cache(kwargs.get(name)) or not layers:
            continue
        for i, layer in enumerate(layers):
            if getattr(layer, "is_sliding", False) and hasattr(layer, "sliding_window"):
                bounded.update(input_name(name, f"{i}.{part}") for part in ("key", "value"))
    return bounded


def flat_outputs(output: Any) -> dict[str, torch.Tensor]:
    """Tensors of a forward's output in pytree order (`logits`, `present.0.key`, ...)."""
    if isinstance(output, torch.Tensor):
        return {"output": output}
    items = output.items() if isinstance(output, dict) else ((f"output_{i}", v) for i, v in enumerate(output))
    flat: dict[str, torch.Tensor] = {}
    for field, value in items:
        if isinstance(value, torch.Tensor):
            flat[field] = value
        elif is_cache(value):
            leaves, tensors, _ = flatten_cache(value)
            flat.update((output_name(field, leaf), t) for leaf, t in zip(leaves, tensors))
        elif isinstance(value, (tuple, list)):  # nested too (switch_transformers' per-layer router tuples)
            for i, item in enumerate(value):
                flat.update(flat_outputs({f"{field}.{i}": item}))
        elif isinstance(value, dict):  # a nested output (CLIP's text_model_output.last_hidden_state)
            flat.update(flat_outputs({f"{field}.{k}": v for k, v in value.items()}))
    return flat
