"""Default positions: what a decoder uses as `position_ids` when a call gives none.

optimum's ORTModelForCausalLM fills missing `position_ids` by counting 0.. from each row's first token.
Many PyTorch decoders count the same way; some do not, and a plain `model(input_ids, attention_mask)` then
differs from PyTorch's:

- `padding:<idx>` — RoBERTa-style embeddings: `idx + 1 + running count of non-padding ids`, `idx` on
  padding ids (roberta, camembert, xlm-roberta, data2vec-text, ... as decoders).
- `mask` — running count of attended tokens minus one (biogpt on transformers 4); what `generate`
  passes by default.
- `count` — 0.. from each row's first token, padding included (optimum's own default).

`generate` has a rule too: transformers passes `mask` positions unless the model prepares its own inputs
(xlm-roberta-xl passes `padding:<idx>` ones) or takes none from it. A `--dynamo` export finds both rules
(running the model, reading the positions its captured `generate` passed) and writes each into the graph's
metadata, `METADATA_KEY` and `GENERATE_KEY`, only where it differs from optimum's; `ort_runtime` applies
them when a call gives no positions and to the inputs `generate` prepares.
"""

from __future__ import annotations

METADATA_KEY = "optimum_dynamo.default_positions"
GENERATE_KEY = "optimum_dynamo.generate_positions"


def candidates(pad_token_id) -> list[str]:
    """The rules worth trying for a model whose padding id is `pad_token_id`."""
    return ["mask"] + ([f"padding:{int(pad_token_id)}"] if pad_token_id is not None else [])


def positions(rule: str, input_ids, attention_mask, past: int):
    """`position_ids` [batch, new tokens] of `rule` for a call after `past` earlier tokens."""
    import torch

    if rule == "count":
        return torch.arange(past, past + input_ids.shape[1]).expand(input_ids.shape[0], -1)
    if rule == "mask":
        counted = (torch.cumsum(attention_mask, dim=1) * attention_mask - 1).long()
        return counted[:, past:]
    if rule.startswith("padding:"):
        idx = int(rule.split(":", 1)[1])
        real = input_ids.ne(idx).long()
        return (torch.cumsum(real, dim=1) + past) * real + idx
    raise ValueError(f"unknown default-positions rule {rule!r}")
