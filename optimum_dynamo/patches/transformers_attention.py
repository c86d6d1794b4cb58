"""Attention outputs stay contiguous in the exported graph.

transformers 5's SDPA path ends with `transpose(1, 2).contiguous()`. While tracing, the CPU SDPA kernel's
output is already laid out so that the transpose is contiguous, so `.contiguous()` is dropped from the
graph; once SDPA is decomposed for ONNX the transpose is not contiguous any more and the following
`reshape` (traced as a view) fails to decompose (seen on T5, whose position bias goes in as a float mask).
An explicit copy survives tracing.
"""

import torch

from .registry import original, register_patch

_TARGET = "transformers.modeling_utils.AttentionInterface.get_interface"


def _contiguous(attention):
    def forward(*args, **kwargs):
        output, weights = attention(*args, **kwargs)
        return output.clone(memory_format=torch.contiguous_format), weights

    return forward


@register_patch(_TARGET, versions={"transformers": ">=5"}, reason="keep the copy after the attention transpose")
def get_interface(self, attn_implementation, default):
    return _contiguous(original(_TARGET)(self, attn_implementation, default))
