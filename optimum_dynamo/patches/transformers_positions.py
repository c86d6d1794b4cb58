"""Default positions of a call given a cache.

transformers 5's Bamba numbers the tokens of a call without `position_ids` from 0, whatever its cache holds
(its siblings, Falcon-H1, GraniteMoeHybrid, Jamba..., count from `past_key_values.get_seq_length()`).
`generate` passes positions; the exported graph of a state model steps every token without them (see
docs/caches.md, "State caches"), so each token was rotated as if it stood at position 0. The patch counts
from the cache's length, as the siblings do; a call with positions, or without a cache, is unchanged."""

import torch

from .registry import original, register_patch

_V5 = {"transformers": ">=5.4"}  # its forward since 5.4; measured on 5.13, 5.22, 5.23


@register_patch("transformers.models.bamba.modeling_bamba.BambaModel.forward", versions=_V5,
                reason="default positions 0.. whatever the cache holds -> counted from the cache's length")
def bamba_positions_after_the_cache(self, input_ids=None, attention_mask=None, position_ids=None,
                                    past_key_values=None, inputs_embeds=None, use_cache=None, **kwargs):
    if position_ids is None and past_key_values is not None:
        tokens = input_ids if inputs_embeds is None else inputs_embeds
        start = past_key_values.get_seq_length()
        position_ids = (torch.arange(tokens.shape[1], device=tokens.device) + start).unsqueeze(0)
    return original("transformers.models.bamba.modeling_bamba.BambaModel.forward")(
        self, input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
        past_key_values=past_key_values, inputs_embeds=inputs_embeds, use_cache=use_cache, **kwargs)
