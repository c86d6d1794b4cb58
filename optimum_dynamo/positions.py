"""Which default-positions rule a decoder follows (see `legacy_bridge.positions`), found by running it.

The captured prefill (its ids and attention mask) goes through the model once without `position_ids`
and once per rule with them: optimum's own count first (then nothing is recorded), then the other rules.
The first whose logits equal the call without positions on the attended tokens is the model's rule.
"""

from __future__ import annotations

import inspect

import torch
from legacy_bridge import positions as rules


def _count(input_ids, attention_mask, past: int):
    """optimum's runtime default: 0.. from each row's first token."""
    return torch.arange(past, past + input_ids.shape[1]).expand(input_ids.shape[0], -1)


def default_positions(model, calls) -> dict[str, str]:
    """Graph metadata `{METADATA_KEY: rule}` when the model numbers missing positions other than optimum's
    runtime does; {} when it counts the same way, takes no positions, or no rule reproduces it."""
    if "position_ids" not in inspect.signature(model.forward).parameters:
        return {}
    first = next((c.kwargs for c in calls if c.kwargs.get("input_ids") is not None
                  and c.kwargs.get("attention_mask") is not None), None)
    if first is None:
        return {}
    ids, mask = first["input_ids"], first["attention_mask"]
    past = mask.shape[1] - ids.shape[1]
    if past:  # a prefill is wanted: its mask covers exactly its tokens
        return {}
    real = mask.bool()

    def logits(position_ids=None):
        with torch.no_grad():
            return model(input_ids=ids, attention_mask=mask, position_ids=position_ids, use_cache=False).logits[real]

    expected = logits()
    tolerance = 1e-3 * max(expected.abs().max().item(), 1.0)
    pad = getattr(model.config.get_text_config(decoder=True), "pad_token_id", None)
    for name, make in [("count", _count), *((r, lambda i, m, p, r=r: rules.positions(r, i, m, p))
                                            for r in rules.candidates(pad))]:
        try:
            found = logits(make(ids, mask, past))
        except (IndexError, RuntimeError):  # e.g. position -1 in an embedding table without an offset
            continue
        if (found - expected).abs().max().item() <= tolerance:
            return {} if name == "count" else {rules.METADATA_KEY: name}
    return {}
