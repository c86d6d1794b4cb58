"""Masks kept when nothing is masked.

Some models drop a mask when it masks nothing, a branch on the data, which torch.export cannot trace. The
replacements always keep the mask: masking nothing, it changes no value, and one graph serves whole and padded
inputs.
- Idefics2's vision tower on transformers 4.57 drops its patch mask when every patch is set (`if not
  torch.any(~mask)`): the mask is always passed (additive, 0 where a patch is set), as 4.57 does when some patch
  is not.
- FSMT's `make_padding_mask` returns None for a decoder input without padding (`if not padding_mask.any()`): the
  mask is always returned (its attention fills nothing where it is all False).
"""

import torch

from .registry import register_patch

_V4 = {"transformers": ">=4.57,<5"}  # measured on 4.57; transformers 5 builds the mask without the branch


@register_patch("transformers.models.idefics2.modeling_idefics2.Idefics2VisionTransformer.forward", versions=_V4,
                reason="a branch on an all-set patch mask -> the mask always passed")
def idefics2_patch_mask(self, pixel_values, patch_attention_mask=None, **kwargs):
    from transformers.modeling_outputs import BaseModelOutput

    batch, size = pixel_values.size(0), self.config.patch_size
    if patch_attention_mask is None:
        patch_attention_mask = torch.ones((batch, pixel_values.size(2) // size, pixel_values.size(3) // size),
                                          dtype=torch.bool, device=pixel_values.device)
    hidden_states = self.embeddings(pixel_values=pixel_values, patch_attention_mask=patch_attention_mask)
    mask = patch_attention_mask.view(batch, -1)
    if self.config._attn_implementation != "flash_attention_2":  # (batch, 1, patches, patches), as 4.57 expands it
        dtype, length = hidden_states.dtype, mask.shape[1]
        mask = torch.zeros((), dtype=dtype).masked_fill(~mask[:, None, None, :], torch.finfo(dtype).min)
        mask = mask.expand(batch, 1, length, length)
    outputs = self.encoder(inputs_embeds=hidden_states, attention_mask=mask, **kwargs)
    return BaseModelOutput(last_hidden_state=self.post_layernorm(outputs.last_hidden_state))


@register_patch("transformers.models.fsmt.modeling_fsmt.make_padding_mask", versions={"transformers": ">=4.57"},
                reason="a padding mask dropped when nothing is padded -> always kept")
def fsmt_padding_mask(input_ids, padding_idx=1):
    return input_ids.eq(padding_idx)
