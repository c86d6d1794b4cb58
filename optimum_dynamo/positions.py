"""Which positions rules a decoder follows (see `legacy_bridge.positions`).

A plain call: the captured prefill (its ids and attention mask) goes through the model once without
`position_ids` and once per rule with them: optimum's own count first (then nothing is recorded), then
the other rules. The first whose logits equal the call without positions on the attended tokens is the
model's rule. `generate`: the positions the captured prefill was given, compared on attended tokens with
each rule (`mask`, what optimum's runtime gets from `generate`, records nothing); none given: the plain
call's rule.
"""

from __future__ import annotations

import inspect

import torch
from legacy_bridge import positions as rules


def default_positions(model, calls) -> dict[str, str]:
    """Graph metadata: `METADATA_KEY` / `GENERATE_KEY` where the model's plain-call / generate positions
    follow another rule than optimum's runtime; {} when both agree, it takes no positions, or no rule fits."""
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

    def logits(position_ids=None):  # row by row: these probes need no more memory than a one-row prompt
        with torch.no_grad():
            return torch.cat([model(input_ids=ids[i:i + 1], attention_mask=mask[i:i + 1], use_cache=False,
                                    position_ids=None if position_ids is None else position_ids[i:i + 1]
                                    ).logits[0][real[i]] for i in range(ids.shape[0])])

    expected = logits()
    tolerance = 1e-3 * max(expected.abs().max().item(), 1.0)
    pad = getattr(model.config.get_text_config(decoder=True), "pad_token_id", None)
    found_rule = None
    for name in ["count", *rules.candidates(pad)]:
        try:
            found = logits(rules.positions(name, ids, mask, past))
        except (IndexError, RuntimeError):  # e.g. position -1 in an embedding table without an offset
            continue
        if (found - expected).abs().max().item() <= tolerance:
            found_rule = name
            break
    metadata = {rules.METADATA_KEY: found_rule} if found_rule not in (None, "count") else {}
    given = first.get("position_ids")
    if given is None:  # generate gives none: the model numbers them itself
        generate_rule = found_rule
    else:
        generate_rule = next((r for r in ["mask", "count", *rules.candidates(pad)[1:]]
                              if torch.equal(rules.positions(r, ids, mask, past)[real], given[real])), None)
    if generate_rule not in (None, "mask"):
        metadata[rules.GENERATE_KEY] = generate_rule
    return metadata
