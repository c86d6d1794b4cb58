"""The patch mask of Idefics2's vision tower on transformers 4.

4.57 drops the mask when every patch is set (`if not torch.any(~mask)`): a branch on the data, which
torch.export cannot trace. The replacement always passes the mask (additive, 0 where a patch is set), as
4.57 does when some patch is not: the same attention, and one graph for whole and padded images."""

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
