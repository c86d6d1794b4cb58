"""Mask creation: an exported graph must apply the attention mask it is given.

transformers may drop the mask (and rely on SDPA's `is_causal`) when it sees no padding;
under torch.export that decision would be baked into the graph, or fail on a symbolic bool.

The transformers 4 hybrids Jamba and Zamba2 build their causal mask `cache_position[-1] + 1` keys long (a
value: an unbacked size that SDPA's mask slicing cannot guard on); the patch takes the 2D mask's length.
"""

import torch

from .registry import original, register_patch

_REASON = "keep the attention mask in the graph so padded batches work"


@register_patch(
    "transformers.masking_utils._ignore_causal_mask_sdpa", versions={"transformers": ">=4.53,<5.14"}, reason=_REASON
)
def keep_causal_mask(padding_mask, query_length, kv_length, kv_offset, local_attention_size=None):
    return False


@register_patch(
    "transformers.masking_utils._ignore_causal_mask_sdpa", versions={"transformers": ">=5.14"}, reason=_REASON
)
def keep_causal_mask_q_offset(padding_mask, q_length, kv_length, q_offset, kv_offset, local_attention_size=None):
    return False


_HYBRID_MASK_REASON = "mask length read from cache_position's last value -> from the 2D attention mask's length"


def hybrid_causal_mask(self, attention_mask, input_tensor, cache_position):
    """Additive mask [batch, 1, query, key]: key k is visible from query q when k <= cache_position[q]
    and the 2D mask keeps k. The key length is the 2D mask's, not `cache_position[-1] + 1` (a value)."""
    if attention_mask is None or attention_mask.dim() != 2 or self.config._attn_implementation == "flash_attention_2":
        return original(f"{type(self).__module__}.{type(self).__qualname__}._update_causal_mask")(
            self, attention_mask, input_tensor, cache_position
        )
    keys = torch.arange(attention_mask.shape[-1], device=input_tensor.device)
    visible = (keys[None, :] <= cache_position[:, None])[None, None] & attention_mask[:, None, None, :].bool()
    return torch.zeros(visible.shape, dtype=input_tensor.dtype).masked_fill(~visible, torch.finfo(input_tensor.dtype).min)


for _model in ("jamba.modeling_jamba.JambaModel", "zamba2.modeling_zamba2.Zamba2Model"):
    register_patch(f"transformers.models.{_model}._update_causal_mask", versions={"transformers": ">=4.51,<5"},
                   reason=_HYBRID_MASK_REASON)(hybrid_causal_mask)


_DECODER_MASK = ("transformers.models.bigbird_pegasus.modeling_bigbird_pegasus.BigBirdPegasusPreTrainedModel"
                 "._update_causal_mask")


@register_patch(_DECODER_MASK, versions={"transformers": ">=4.53,<5"},
                reason="a decoder given no mask: keys for its own length, not one more")
def decoder_mask_of_ones(self, attention_mask, input_tensor, cache_position, past_key_values):
    """BigBird-Pegasus's decoder given no mask makes one of ones only outside torch.compile; traced, its causal mask
    is then `past + length + 1` keys long, which its eager attention adds to `past + length` scores (a size
    mismatch). The patch gives it the ones eager mode does."""
    if attention_mask is None:
        past = past_key_values.get_seq_length() if past_key_values is not None else 0
        attention_mask = torch.ones(input_tensor.shape[0], past + input_tensor.shape[1], device=input_tensor.device)
    return original(_DECODER_MASK)(self, attention_mask, input_tensor, cache_position, past_key_values)
