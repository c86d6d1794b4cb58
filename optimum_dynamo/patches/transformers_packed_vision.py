"""Packed vision attention (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) as one masked attention.

These towers attend within each image of a packed sequence of patches (`cu_seqlens` bounds the images).
Without flash attention transformers splits the sequence with `lengths.tolist()` and loops over the images,
which fixes the number of images and their sizes in torch.export. The patch attends over the whole sequence
once, with a mask that is 0 between patches of the same image and the dtype's minimum elsewhere: the same
softmax per image (masked weights are exactly 0), the number of images and patches stay dynamic.
"""

import sys

import torch

from .registry import register_patch

_CLASSES = [
    "transformers.models.qwen2_vl.modeling_qwen2_vl.VisionAttention",
    "transformers.models.qwen2_5_vl.modeling_qwen2_5_vl.Qwen2_5_VLVisionAttention",
    "transformers.models.qwen3_vl.modeling_qwen3_vl.Qwen3VLVisionAttention",
]


def packed_mask(length, cu_seqlens: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[length, length]: 0 between positions of the same packed sequence, the dtype's minimum elsewhere. A position's
    sequence is the number of `cu_seqlens[1:]` at or before it: any boundaries in any order, repeated or past the
    end, give the same sequences."""
    sequence = (torch.arange(length, device=cu_seqlens.device)[:, None] >= cu_seqlens[None, 1:]).sum(-1)
    return torch.zeros((), dtype=dtype).masked_fill(sequence[:, None] != sequence[None, :], torch.finfo(dtype).min)


def _attend_per_image(self, hidden_states, cu_seqlens, position_embeddings, kwargs):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    modeling = sys.modules[type(self).__module__]
    length = hidden_states.shape[0]
    query, key, value = self.qkv(hidden_states).reshape(length, 3, self.num_heads, -1).permute(1, 0, 2, 3).unbind(0)
    query, key = modeling.apply_rotary_pos_emb_vision(query, key, *position_embeddings)
    query, key, value = (t.transpose(0, 1).unsqueeze(0) for t in (query, key, value))
    mask = packed_mask(length, cu_seqlens, query.dtype)
    implementation = self.config._attn_implementation
    attention = (modeling.eager_attention_forward if implementation == "eager" else ALL_ATTENTION_FUNCTIONS[implementation])
    output, _ = attention(self, query, key, value, attention_mask=mask[None, None], scaling=self.scaling, dropout=0.0,
                          is_causal=False, **kwargs)
    return self.proj(output.reshape(length, -1).contiguous())


def packed_vision_attention(self, hidden_states, cu_seqlens, position_embeddings=None, max_seqlen=None, **kwargs):
    return _attend_per_image(self, hidden_states, cu_seqlens, position_embeddings, kwargs)


def packed_vision_attention_without_max_seqlen(self, hidden_states, cu_seqlens, position_embeddings=None, **kwargs):
    return _attend_per_image(self, hidden_states, cu_seqlens, position_embeddings, kwargs)


def packed_vision_attention_rotary(self, hidden_states, cu_seqlens, rotary_pos_emb=None, position_embeddings=None,
                                   **kwargs):
    return _attend_per_image(self, hidden_states, cu_seqlens, position_embeddings, kwargs)


# the forward's signature by transformers release (4.53 takes an `attention_mask` and needs no patch): `rotary_pos_emb`
# dropped in 5.10, `max_seqlen` added in 5.15
for _versions, _replacement in ((">=5.15", packed_vision_attention),
                                (">=5.10,<5.15", packed_vision_attention_without_max_seqlen),
                                (">=4.54,<5.10", packed_vision_attention_rotary)):
    for _cls in _CLASSES:
        register_patch(f"{_cls}.forward", versions={"transformers": _versions},
                       reason="per-image attention without .tolist()")(_replacement)
