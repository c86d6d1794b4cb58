"""Mask creation: an exported graph must apply the attention mask it is given.

transformers may drop the mask (and rely on SDPA's `is_causal`) when it sees no padding;
under torch.export that decision would be baked into the graph, or fail on a symbolic bool.
"""

from .registry import register_patch

_REASON = "keep the attention mask in the graph so padded batches work"


@register_patch(
    "transformers.masking_utils._ignore_causal_mask_sdpa", versions={"transformers": ">=4.53,<5"}, reason=_REASON
)
def keep_causal_mask_v4(padding_mask, query_length, kv_length, kv_offset, local_attention_size=None):
    return False


@register_patch("transformers.masking_utils._ignore_causal_mask_sdpa", versions={"transformers": ">=5"}, reason=_REASON)
def keep_causal_mask_v5(padding_mask, q_length, kv_length, q_offset, kv_offset, local_attention_size=None):
    return False
