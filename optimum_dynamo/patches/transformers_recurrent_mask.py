"""Padding mask of state (mamba / linear-attention / conv) layers in hybrid models.

`create_recurrent_attention_mask` drops the mask of single-token steps ("a generated token is never
padding"). An exported hybrid advances its states one token per call, the prompt included (see
docs/caches.md, "State caches"), so a left-padding token arrives alone too and must still be masked
out of the state. The patch keeps the mask's last column on single-token steps: 1 for every token
`generate` decodes (a no-op there), 0 for padding. Applied while capturing and exporting.

transformers 4 has one method per hybrid model instead, which drops the mask when `cache_position[0] > 0`
or the mask is all ones (both data-dependent: torch.export cannot branch on them); the patch keeps the
mask's columns of the current tokens, the same product for every call `generate` makes. Mamba-2's and
Falcon-H1's mixers (transformers 4) mask their padding states only for a multi-token batch; the patch masks
whenever a mask is given (`generate` gives none past the prompt), also the single-token step's
`[batch, channels]` states. Zamba2's mixer (transformers 4) masks only on its prompt path; on the path of a
step with a previous state the patch masks the token's input, and a padding token leaves the SSM state as it
was (zero: left padding comes first, where the prompt path adds nothing to it either)."""

import torch

from .registry import original, register_patch

_V5 = {"transformers": ">=5.13"}  # where transformers has it (5.13); measured on 5.13, 5.22, 5.23
_REASON = "single-token steps keep their padding-mask column (the prompt is stepped token by token)"


def _last_columns(attention_mask, inputs_embeds):
    if attention_mask is None or attention_mask.ndim != 2:
        return None
    return attention_mask[:, -inputs_embeds.shape[1] :]


@register_patch("transformers.masking_utils.create_recurrent_attention_mask", versions=_V5, reason=_REASON,
                where_imported=True)  # every model module imports it by name (90 in 5.23)
def recurrent_mask_of_new_tokens(config, inputs_embeds, attention_mask, past_key_values=None, **kwargs):
    return _last_columns(attention_mask, inputs_embeds)


_V4 = {"transformers": ">=4.51,<5"}
_V4_REASON = "data-dependent mask skipping -> the current tokens' mask columns"
_V4_TARGETS = [f"transformers.models.{m}.{cls}._update_mamba_mask" for m, cls in (
    ("jamba.modeling_jamba", "JambaModel"), ("bamba.modeling_bamba", "BambaModel"),
    ("falcon_h1.modeling_falcon_h1", "FalconH1Model"),
    ("granitemoehybrid.modeling_granitemoehybrid", "GraniteMoeHybridModel"))]
_V4_TARGETS.append("transformers.models.qwen3_next.modeling_qwen3_next.Qwen3NextModel._update_linear_attn_mask")


def recurrent_mask_of_current_tokens(self, attention_mask, cache_position):
    return None if attention_mask is None else attention_mask[:, -cache_position.shape[0] :]


for _target in _V4_TARGETS:
    register_patch(_target, versions=_V4, reason=_V4_REASON)(recurrent_mask_of_current_tokens)


_PADDING_REASON = "padding states masked only for several tokens -> whenever a mask is given"


_PADDING = {"transformers": ">=4.51,<5.15"}  # 5.16 masks whenever a mask is given (5.15 not measured: included)


@register_patch("transformers.models.mamba2.modeling_mamba2.apply_mask_to_padding_states", versions=_PADDING,
                reason=_PADDING_REASON)
@register_patch("transformers.models.falcon_h1.modeling_falcon_h1.apply_mask_to_padding_states", versions=_PADDING,
                reason=_PADDING_REASON)
def mamba2_padding_states(hidden_states, attention_mask):
    if attention_mask is None:
        return hidden_states
    mask = attention_mask[:, -1:] if hidden_states.dim() == 2 else attention_mask[:, -hidden_states.shape[1]:, None]
    return (hidden_states * mask).to(hidden_states.dtype)


_ZAMBA2_MIXER = "transformers.models.zamba2.modeling_zamba2.Zamba2MambaMixer.torch_forward"


@register_patch(_ZAMBA2_MIXER, versions=_V4,
                reason="padding masked only on the prompt path -> on single-token steps too")
def zamba2_padding_steps(self, input_states, cache_params=None, attention_mask=None):
    forward = original(_ZAMBA2_MIXER)
    if attention_mask is None or cache_params is None or not cache_params.has_previous_state:
        return forward(self, input_states, cache_params, attention_mask)
    keep = attention_mask[:, -input_states.shape[1]:]
    before = cache_params.ssm_states[self.layer_idx].clone()
    out = forward(self, (input_states * keep[:, :, None]).to(input_states.dtype), cache_params, None)
    after = cache_params.ssm_states[self.layer_idx]
    after.copy_(torch.where(keep[:, -1].bool()[:, None, None, None], after, before))
    return out
