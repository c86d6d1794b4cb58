"""Jamba on transformers 4: data-dependent branches torch.export cannot trace.

- The sparse MoE block visits only the experts hit: every expert runs on every token, weighted by the
  routing matrix (as for Mixtral, see transformers_moe.py; Jamba does not renormalize the top-k).
- its `_update_mamba_mask` is patched with the other hybrids' (transformers_recurrent_mask.py)."""

import torch

from .registry import original, register_patch
from .transformers_moe import dense_experts

_V4 = {"transformers": ">=4.51,<5"}


@register_patch("transformers.models.jamba.modeling_jamba.JambaSparseMoeBlock.forward", versions=_V4,
                reason="data-dependent expert loop -> dense experts weighted by the routing matrix")
def dense_jamba_moe(self, hidden_states):
    batch, length, hidden = hidden_states.shape
    flat = hidden_states.reshape(-1, hidden)
    logits = self.router(flat)
    return dense_experts(self, flat, logits, False).reshape(batch, length, hidden), logits


@register_patch("transformers.models.jamba.modeling_jamba.JambaModel._update_causal_mask", versions=_V4,
                reason="mask length read from cache_position's last value -> from the 2D attention mask's length")
def jamba_causal_mask(self, attention_mask, input_tensor, cache_position):
    """Additive mask [batch, 1, query, key]: key k is visible from query q when k <= cache_position[q]
    and the 2D mask keeps k. The key length is the 2D mask's, not `cache_position[-1] + 1` (a value)."""
    if attention_mask is None or attention_mask.dim() != 2 or self.config._attn_implementation == "flash_attention_2":
        return original("transformers.models.jamba.modeling_jamba.JambaModel._update_causal_mask")(
            self, attention_mask, input_tensor, cache_position
        )
    keys = torch.arange(attention_mask.shape[-1], device=input_tensor.device)
    visible = (keys[None, :] <= cache_position[:, None])[None, None] & attention_mask[:, None, None, :].bool()
    return torch.zeros(visible.shape, dtype=input_tensor.dtype).masked_fill(~visible, torch.finfo(input_tensor.dtype).min)
