"""Grouped-query attention handed to SDPA unrepeated (`enable_gqa=True`) for fused exports.

transformers repeats the key/value heads before SDPA unless the device kernel supports GQA with a mask.
With `--optimize O3` the graph's SDPA becomes ONNX `Attention` (opset 23), which takes fewer key/value
heads than query heads: the repeat (Unsqueeze/Expand/Reshape per key and value, per layer) is not needed.
"""

from __future__ import annotations

from .registry import register_patch

FUSED_ATTENTION = "fused_attention"
_TARGET = "transformers.integrations.sdpa_attention.use_gqa_in_sdpa"
_REASON = "ONNX Attention runs grouped-query attention itself: no repeat_kv in the graph"


@register_patch(_TARGET, versions={"transformers": ">=4.54,<5.13"}, reason=_REASON, option=FUSED_ATTENTION)
def gqa_in_sdpa(attention_mask, key):
    return True


@register_patch(_TARGET, versions={"transformers": ">=5.13"}, reason=_REASON, option=FUSED_ATTENTION)
def gqa_in_sdpa_with_value(attention_mask, key, value):
    return True
