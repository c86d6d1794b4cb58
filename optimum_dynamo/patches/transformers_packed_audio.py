"""Packed audio attention (Qwen3-ASR) as one masked attention.

Qwen3-ASR's audio tower packs every clip's frames into one sequence and attends within windows of it. Its
window bounds come from a Python loop over the clips on `.item()` values, and without flash attention each window
is attended apart (`lengths.tolist()`): both fix the clips in torch.export. The bounds are made with tensor ops
instead (each clip's window starts, at the same stride, and its end; candidates past a clip's end moved past the
sequence), and the attention runs once over the sequence with a mask that is 0 within a window
(`packed_mask`), by torch's scaled dot-product attention as transformers' sdpa runs it: the same softmax per
window, the clips' number and lengths dynamic.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from .registry import register_patch
from .transformers_packed_vision import packed_mask

_MODULE = "transformers.models.qwen3_asr.modeling_qwen3_asr"
_VERSIONS = {"transformers": ">=5.0"}


@register_patch(f"{_MODULE}.get_audio_cu_seqlens", versions=_VERSIONS, reason="window bounds without .item()")
def audio_windows(chunk_lengths, feature_lens, n_window_infer, n_window, kwargs=None):
    if kwargs is not None and (given := kwargs.pop("cu_seqlens", None)) is not None:
        return given
    rows = sys.modules[_MODULE]._get_feat_extract_output_lengths
    lengths = rows(feature_lens, n_window)  # each clip's rows after the convolutions
    window = rows(chunk_lengths, n_window).max() * (n_window_infer // (n_window * 2))
    ends = lengths.cumsum(0)
    chunks = chunk_lengths.shape[0] // feature_lens.shape[0]  # a clip has at most this many windows
    starts = (ends - lengths)[:, None] + window * torch.arange(chunks + 1, device=ends.device)[None, :]
    starts = torch.where(starts < ends[:, None], starts, ends[-1])
    return torch.cat([ends.new_zeros(1), starts.flatten(), ends]).to(torch.int32)


@register_patch(f"{_MODULE}.Qwen3ASRAudioAttention.forward", versions=_VERSIONS,
                reason="per-window attention without .tolist()")
def packed_audio_attention(self, hidden_states, cu_seqlens, max_seqlen=None, **kwargs):
    length = hidden_states.shape[0]
    query, key, value = (proj(hidden_states).reshape(length, self.num_heads, -1).transpose(0, 1).unsqueeze(0)
                         for proj in (self.q_proj, self.k_proj, self.v_proj))
    # torch's attention as transformers' sdpa calls it (whose `q_length > 1` test guards on the packed length)
    output = F.scaled_dot_product_attention(query, key, value, attn_mask=packed_mask(length, cu_seqlens, query.dtype),
                                            scale=self.scaling)
    return self.out_proj(output.transpose(1, 2).reshape(length, -1).contiguous())
