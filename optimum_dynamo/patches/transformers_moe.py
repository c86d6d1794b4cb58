"""Mixture-of-experts blocks of transformers 4: the routing loop visits only the experts hit (or skips an
expert without tokens), a data-dependent loop torch.export cannot trace. During export every expert runs on
every token and its output is weighted by the routing matrix (zero for experts not chosen): the same result,
static shapes. Each block keeps its own routing; `dense_topk` is the one dispatch.
(transformers 5 loads these models with batched-matmul experts instead, see exporters/base.py.)"""

import torch
import torch.nn.functional as F

from .registry import register_patch

_V4 = {"transformers": ">=4.51,<5"}
_REASON = "data-dependent expert loop -> dense experts weighted by the routing matrix"


def dense_topk(experts, flat: torch.Tensor, top_weights: torch.Tensor, top_experts: torch.Tensor) -> torch.Tensor:
    """sum_e experts[e](flat) * weight of e for the token (0 where e is not among its top-k); `experts` is
    any sequence of callables on [tokens, hidden]."""
    routing = torch.zeros(flat.shape[0], len(experts), dtype=top_weights.dtype, device=flat.device)
    routing = routing.scatter(1, top_experts, top_weights)
    out = torch.zeros_like(flat, dtype=top_weights.dtype)
    for index, expert in enumerate(experts):
        out = out + expert(flat) * routing[:, index : index + 1]
    return out.to(flat.dtype)


def dense_experts(block, flat: torch.Tensor, router_logits: torch.Tensor, normalize: bool) -> torch.Tensor:
    weights = F.softmax(router_logits, dim=1, dtype=torch.float)
    top_weights, top_experts = torch.topk(weights, block.top_k, dim=-1)
    if normalize:
        top_weights = top_weights / top_weights.sum(dim=-1, keepdim=True)
    return dense_topk(block.experts, flat, top_weights.to(flat.dtype), top_experts)


@register_patch("transformers.models.mixtral.modeling_mixtral.MixtralSparseMoeBlock.forward", versions=_V4, reason=_REASON)
@register_patch("transformers.models.minimax.modeling_minimax.MiniMaxSparseMoeBlock.forward", versions=_V4,
                reason=_REASON)  # Mixtral's block under another name
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
@register_patch("transformers.models.qwen3_next.modeling_qwen3_next.Qwen3NextSparseMoeBlock.forward", versions=_V4,
                reason=_REASON)  # Qwen2-MoE's block (a gated shared expert) under another name
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


# deepseek_v3-style blocks route in their gate and dispatch in `moe(hidden_states, topk_indices, topk_weights)`.
@register_patch("transformers.models.deepseek_v3.modeling_deepseek_v3.DeepseekV3MoE.moe", versions=_V4, reason=_REASON)
@register_patch("transformers.models.dots1.modeling_dots1.Dots1MoE.moe", versions=_V4, reason=_REASON)
@register_patch("transformers.models.glm4_moe.modeling_glm4_moe.Glm4MoeMoE.moe", versions=_V4, reason=_REASON)
@register_patch("transformers.models.glm4v_moe.modeling_glm4v_moe.Glm4vMoeTextMoE.moe", versions=_V4, reason=_REASON)
def dense_moe_dispatch(self, hidden_states, topk_indices, topk_weights):
    return dense_topk(self.experts, hidden_states, topk_weights, topk_indices).type(hidden_states.dtype)


@register_patch("transformers.models.ernie4_5_moe.modeling_ernie4_5_moe.Ernie4_5_MoeSparseMoeBlock.forward",
                versions=_V4, reason=_REASON)
def dense_ernie4_5_moe(self, hidden_states):
    batch, length, hidden = hidden_states.shape
    flat = hidden_states.view(-1, hidden)
    router_logits = self.gate(flat.float())
    weights = F.softmax(router_logits, dim=1, dtype=torch.float)
    _, top_experts = torch.topk(self.moe_statics(weights), self.top_k, dim=-1)  # bias-corrected choice
    top_weights = torch.gather(weights, dim=-1, index=top_experts)
    top_weights = top_weights / torch.clamp(top_weights.sum(dim=-1, keepdim=True), min=self.norm_min)
    out = dense_topk(self.experts, flat, top_weights.to(flat.dtype), top_experts)
    if self.shared_experts is not None:
        out = out + self.shared_experts(flat)
    return out.reshape(batch, length, hidden), router_logits


@register_patch("transformers.models.hunyuan_v1_moe.modeling_hunyuan_v1_moe.HunYuanMoEV1Moe.forward",
                versions=_V4, reason=_REASON)
def dense_hunyuan_v1_moe(self, hidden_states):
    batch, length, hidden = hidden_states.shape
    shared = self.shared_mlp(hidden_states)
    router_logits = self.gate(hidden_states)
    flat = hidden_states.view(-1, hidden)
    top_weights, top_experts = torch.topk(F.softmax(router_logits, dim=1, dtype=torch.float), self.top_k, dim=-1)
    top_weights = top_weights / top_weights.sum(dim=-1, keepdim=True)
    out = dense_topk(self.experts, flat, top_weights.to(flat.dtype), top_experts)
    return out.reshape(batch, length, hidden) + shared


@register_patch("transformers.models.phimoe.modeling_phimoe.PhimoeSparseMoeBlock.forward", versions=_V4, reason=_REASON)
def dense_phimoe(self, hidden_states):
    from transformers.models.phimoe.modeling_phimoe import sparsemixer  # its own routing

    batch, length, hidden = hidden_states.shape
    flat = hidden_states.view(-1, hidden)
    router_logits = self.gate(flat)
    top_weights, top_experts = sparsemixer(router_logits, jitter_eps=self.router_jitter_noise, training=self.training)
    out = dense_topk(self.experts, flat, top_weights.to(flat.dtype), top_experts)
    return out.reshape(batch, length, hidden), router_logits


@register_patch("transformers.models.dbrx.modeling_dbrx.DbrxExperts.forward", versions=_V4, reason=_REASON)
def dense_dbrx_experts(self, x, weights, top_weights, top_experts):
    batch, length, hidden = x.shape
    mlp, shape = self.mlp, (self.moe_num_experts, self.mlp.ffn_hidden_size, self.mlp.hidden_size)
    w1, v1, w2 = mlp.w1.view(shape), mlp.v1.view(shape), mlp.w2.view(shape)
    experts = [lambda t, e=e: mlp(t, w1[e], v1[e], w2[e]) for e in range(self.moe_num_experts)]
    return dense_topk(experts, x.reshape(-1, hidden), top_weights.to(x.dtype), top_experts).reshape(batch, length, hidden)


@register_patch("transformers.models.aria.modeling_aria.AriaGroupedExpertsGemm.forward", versions=_V4, reason=_REASON)
def dense_aria_grouped_gemm(self, input, tokens_per_expert):
    # rows arrive sorted by expert, `tokens_per_expert` of each: each row's expert is where its index falls
    # among the cumulative counts; every expert's product is computed and the row's own is picked
    rows = torch.arange(input.shape[0], device=input.device)
    expert_of_row = (rows[:, None] >= torch.cumsum(tokens_per_expert, 0)[None, :]).sum(dim=1)
    products = torch.matmul(input[None], self.weight)  # [experts, tokens, out]
    index = expert_of_row.clamp(max=self.groups - 1)[None, :, None].expand(1, -1, self.out_features)
    return products.gather(0, index).squeeze(0)
