"""Mixture-of-experts blocks of transformers 4 (mixtral, qwen2_moe, qwen3_moe, gpt_oss): the routing loop
visits only the experts hit, a data-dependent loop torch.export cannot trace. During export every expert
runs on every token and its output is weighted by the routing matrix (zero for experts not chosen): the
same result, static shapes.
(transformers 5 loads these models with batched-matmul experts instead, see exporters/base.py.)"""

import torch
import torch.nn.functional as F

from .registry import register_patch

_V4 = {"transformers": ">=4.51,<5"}
_REASON = "data-dependent expert loop -> dense experts weighted by the routing matrix"


def dense_experts(block, flat: torch.Tensor, router_logits: torch.Tensor, normalize: bool) -> torch.Tensor:
    weights = F.softmax(router_logits, dim=1, dtype=torch.float)
    top_weights, top_experts = torch.topk(weights, block.top_k, dim=-1)
    if normalize:
        top_weights = top_weights / top_weights.sum(dim=-1, keepdim=True)
    routing = torch.zeros_like(weights).scatter(1, top_experts, top_weights).to(flat.dtype)
    out = torch.zeros_like(flat)
    for index, expert in enumerate(block.experts):
        out = out + expert(flat) * routing[:, index : index + 1]
    return out


@register_patch("transformers.models.mixtral.modeling_mixtral.MixtralSparseMoeBlock.forward", versions=_V4, reason=_REASON)
def dense_mixtral_moe(self, hidden_states):
    batch, length, hidden = hidden_states.shape
    flat = hidden_states.reshape(-1, hidden)
    logits = self.gate(flat)
    return dense_experts(self, flat, logits, True).reshape(batch, length, hidden), logits


@register_patch("transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeSparseMoeBlock.forward", versions=_V4, reason=_REASON)
def dense_qwen3_moe(self, hidden_states):
    batch, length, hidden = hidden_states.shape
    flat = hidden_states.reshape(-1, hidden)
    logits = self.gate(flat)
    return dense_experts(self, flat, logits, self.norm_topk_prob).reshape(batch, length, hidden), logits


@register_patch("transformers.models.qwen2_moe.modeling_qwen2_moe.Qwen2MoeSparseMoeBlock.forward", versions=_V4, reason=_REASON)
def dense_qwen2_moe(self, hidden_states):
    batch, length, hidden = hidden_states.shape
    flat = hidden_states.reshape(-1, hidden)
    logits = self.gate(flat)
    out = dense_experts(self, flat, logits, self.norm_topk_prob)
    out = out + F.sigmoid(self.shared_expert_gate(flat)) * self.shared_expert(flat)
    return out.reshape(batch, length, hidden), logits


@register_patch("transformers.models.gpt_oss.modeling_gpt_oss.GptOssExperts.forward",
                versions={"transformers": ">=4.55,<5"}, reason=_REASON)
def dense_gpt_oss_experts(self, hidden_states, router_indices=None, routing_weights=None):
    # routing_weights is [tokens, experts], zero for experts not chosen: every expert runs on every token.
    batch = hidden_states.shape[0]
    experts = routing_weights.shape[1]
    flat = hidden_states.reshape(1, -1, self.hidden_size).expand(experts, -1, -1)
    gate_up = torch.bmm(flat, self.gate_up_proj) + self.gate_up_proj_bias[:, None, :]
    gate = gate_up[..., ::2].clamp(max=self.limit)
    up = gate_up[..., 1::2].clamp(min=-self.limit, max=self.limit)
    out = torch.bmm((up + 1) * gate * torch.sigmoid(gate * self.alpha), self.down_proj) + self.down_proj_bias[:, None, :]
    out = (out * routing_weights.transpose(0, 1)[..., None].to(out.dtype)).sum(dim=0)
    return out.reshape(batch, -1, self.hidden_size)
