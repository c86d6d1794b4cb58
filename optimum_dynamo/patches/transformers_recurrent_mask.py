"""Padding mask of state (mamba / linear-attention / conv) layers in hybrid models, transformers 5.

`create_recurrent_attention_mask` drops the mask of single-token steps ("a generated token is never
padding"). An exported hybrid advances its states one token per call, the prompt included (see
docs/caches.md, "State caches"), so a left-padding token arrives alone too and must still be masked
out of the state. The patch keeps the mask's last column on single-token steps: 1 for every token
`generate` decodes (a no-op there), 0 for padding. Applied while capturing and exporting."""

from .registry import register_patch

_V5 = {"transformers": ">=5.23"}  # measured on 5.23
_REASON = "single-token steps keep their padding-mask column (the prompt is stepped token by token)"


def _last_columns(attention_mask, inputs_embeds):
    if attention_mask is None or attention_mask.ndim != 2:
        return None
    return attention_mask[:, -inputs_embeds.shape[1] :]


@register_patch("transformers.masking_utils.create_recurrent_attention_mask", versions=_V5, reason=_REASON,
                where_imported=True)  # every model module imports it by name (90 in 5.23)
def recurrent_mask_of_new_tokens(config, inputs_embeds, attention_mask, past_key_values=None, **kwargs):
    return _last_columns(attention_mask, inputs_embeds)
