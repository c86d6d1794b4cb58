"""Funnel's relative positions for any sequence length.

The relative-shift attention builds its position lists from the sequence length: as Python ints on transformers 5
(`list(range(seq_len))`, which fixes the length the graph takes) and as tensors whose values bound an `arange` on
4.57 (the same). Every list it builds is a first position and an arithmetic run after it (the <cls> slot, then
every `step`-th position), so the bounds `relative_pos` needs are sums of sizes: the patch keeps each list as
(first, second, step, length) and builds the same vectors with symbolic sizes. The factorized attention is left to
the original. (transformers 4.57 to 5.24 at least.)"""

from __future__ import annotations

import torch

from .registry import original, register_patch

_TARGET = "transformers.models.funnel.modeling_funnel.FunnelAttentionStructure.get_position_embeds"
_REASON = "relative positions from the sequence length as sizes, not Python lists or tensor values"


def _pooled(positions: tuple, block_index: int, config) -> tuple:
    """`stride_pool_pos` on (first, second, step, length): the <cls> slot apart, every other position kept."""
    first, second, step, length = positions
    if config.separate_cls:
        rest = length - 2 if config.truncate_seq else length - 1
        return -(2**block_index) + 1, second, 2 * step, 1 + (rest + 1) // 2
    return first, second + step, 2 * step, (length + 1) // 2


def _relative(positions: tuple, stride: int, pooled: tuple, shift: int, device) -> torch.Tensor:
    """`relative_pos`: from the largest distance down to the smallest, by `stride`."""
    first, second, step, length = positions
    last = second + (length - 2) * step if length > 1 else first
    top = pooled[0] - first + shift * pooled[3] * stride
    return torch.arange(top, pooled[0] - last - 1, -stride, dtype=torch.long, device=device)


@register_patch(_TARGET, versions={"transformers": ">=4.57"}, reason=_REASON)
def funnel_position_embeds(self, seq_len, dtype, device):
    if self.config.attention_type == "factorized":
        return original(_TARGET)(self, seq_len, dtype, device)
    d_model = self.config.d_model
    freq = torch.arange(0, d_model // 2, dtype=torch.int64, device=device).to(dtype)
    inv_freq = 1 / (10000 ** (freq / (d_model // 2)))
    sinusoid = torch.arange(-seq_len * 2, seq_len * 2, dtype=torch.int64, device=device).to(dtype)[:, None] * inv_freq
    pos_embed = torch.cat([self.sin_dropout(torch.sin(sinusoid)), self.cos_dropout(torch.cos(sinusoid))], dim=-1)

    def gathered(rel_pos):
        index = (rel_pos[:, None] + seq_len * 2).expand(rel_pos.size(0), d_model)
        return torch.gather(pos_embed, 0, index)

    pos = (0, 1, 1, seq_len)
    embeds = []
    for block_index in range(self.config.num_blocks):
        pooling = None
        pooled = pos
        if block_index > 0:
            pooled = _pooled(pos, block_index, self.config)
            pooling = gathered(_relative(pos, 2 ** (block_index - 1), pooled, 2, device))
        pos = pooled
        embeds.append([gathered(_relative(pos, 2**block_index, pos, 1, device)), pooling])
    return embeds
