"""Attention outputs stay contiguous in the exported graph.

transformers' SDPA path ends with `transpose(1, 2).contiguous()`. While tracing, the CPU SDPA kernel's
output is already laid out so that the transpose is contiguous, so `.contiguous()` is dropped from the
graph; once SDPA is decomposed for ONNX the transpose is not contiguous any more and the following
`reshape` (traced as a view) fails to decompose (seen where the mask is a float one: T5's position bias on
transformers 5, Doge's dynamic mask on transformers 4). An explicit copy survives tracing. transformers
5.1+ models ask `get_interface`, older ones index the interface.
"""

import torch

from .registry import original, register_patch

_TARGET = "transformers.modeling_utils.AttentionInterface.get_interface"


def _contiguous(attention):
    def forward(*args, **kwargs):
        output, weights = attention(*args, **kwargs)
        return output.clone(memory_format=torch.contiguous_format), weights

    return forward


@register_patch(_TARGET, versions={"transformers": ">=5.1"}, reason="keep the copy after the attention transpose")
def get_interface(self, attn_implementation, default):
    return _contiguous(original(_TARGET)(self, attn_implementation, default))


_TARGET_V4 = "transformers.modeling_utils.AttentionInterface.__getitem__"


@register_patch(_TARGET_V4, versions={"transformers": ">=4.48,<5.1"},
                reason="keep the copy after the attention transpose")
def attention_function(self, key):
    return _contiguous(original(_TARGET_V4)(self, key))
