"""Jamba on transformers 4: data-dependent branches torch.export cannot trace.

- The sparse MoE block visits only the experts hit: every expert runs on every token, weighted by the
  routing matrix (as for Mixtral, see transformers_moe.py; Jamba does not renormalize the top-k).
- its `_update_mamba_mask` is patched with the other hybrids' (transformers_recurrent_mask.py), its
  `_update_causal_mask` with Zamba2's (transformers_masks.py)."""

from .registry import register_patch
from .transformers_moe import dense_experts

_V4 = {"transformers": ">=4.51,<5"}


@register_patch("transformers.models.jamba.modeling_jamba.JambaSparseMoeBlock.forward", versions=_V4,
                reason="data-dependent expert loop -> dense experts weighted by the routing matrix")
def dense_jamba_moe(self, hidden_states):
    batch, length, hidden = hidden_states.shape
    flat = hidden_states.reshape(-1, hidden)
    logits = self.router(flat)
    return dense_experts(self, flat, logits, False).reshape(batch, length, hidden), logits
