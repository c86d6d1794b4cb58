"""WavLM's self-attention without `F.multi_head_attention_forward`.

WavLM attends through torch's functional multi-head attention, with its gated relative position bias as the additive
mask. torch 2.13's decomposition of that function views a transposed output at a dynamic length, and the ONNX export
stops ("Cannot view a tensor with shape ..."); torch 2.15 decomposes it. The patch computes the same attention from
its parts: the three projections, attention scores plus the bias and the padding mask, the output
projection. Attention weights, when asked for, come from the original. (transformers 4.57 to 5.24, torch < 2.15.)"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .registry import original, register_patch

_TARGET = "transformers.models.wavlm.modeling_wavlm.WavLMAttention.torch_multi_head_self_attention"


@register_patch(_TARGET, versions={"transformers": ">=4.57", "torch": "<2.15"},
                reason="multi-head attention in parts: torch 2.13 cannot decompose it at a dynamic length")
def wavlm_attention(self, hidden_states, attention_mask, gated_position_bias, output_attentions):
    if output_attentions:
        return original(_TARGET)(self, hidden_states, attention_mask, gated_position_bias, output_attentions)
    batch, length, _ = hidden_states.shape

    def heads(x: torch.Tensor) -> torch.Tensor:
        return x.view(batch, length, self.num_heads, -1).transpose(1, 2)

    bias = gated_position_bias.view(batch, self.num_heads, length, length)
    if attention_mask is not None:  # the original's key padding mask: positions whose mask is not 1
        bias = bias.masked_fill(attention_mask.ne(1)[:, None, None, :], float("-inf"))
    query, key, value = (heads(proj(hidden_states)) for proj in (self.q_proj, self.k_proj, self.v_proj))
    scores = (query * query.shape[-1] ** -0.5) @ key.transpose(-1, -2) + bias
    weights = F.dropout(scores.softmax(-1), p=self.dropout, training=self.training)
    # in plain matmuls: SDPA's output layout differs after decomposition, and its view fails the same way
    return self.out_proj((weights @ value).transpose(1, 2).reshape(batch, length, self.embed_dim)), None
