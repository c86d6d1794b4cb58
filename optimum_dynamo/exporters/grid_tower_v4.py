"""Transformers 4.57's Qwen2-VL vision tower on inputs derived outside its graph.

transformers >= 5 lets the tower take what it derives from the image grid (`cu_seqlens`, the rotary
`position_ids`) as inputs (`precompute_export_inputs`), so the graph keeps the number of images and their sizes
dynamic. 4.57's tower derives them inside `forward` from the grid's values, which torch.export would fix. Here
the same two tensors are made from the grid in Python (`grid_inputs`), and `run_tower` runs the tower's own
modules on them: patch embedding, blocks, merger. The rotary angles are `position * inv_freq`, the entries of
the table 4.57 builds and indexes (the same products, bit for bit). Towers with more grid-derived inputs
(Qwen2.5-VL's windows, Qwen3-VL's interpolated position table) are not covered: `covers` says which.
"""

from __future__ import annotations

import importlib.util

import torch

TOWERS = ("Qwen2VisionTransformerPretrainedModel",)  # 4.57 classes whose only grid-derived inputs are these two


def covers(tower: torch.nn.Module) -> bool:
    """A tower of `TOWERS` on a transformers without `precompute_export_inputs` (which the newer tower takes)."""
    return type(tower).__name__ in TOWERS and importlib.util.find_spec("transformers.exporters") is None


def grid_inputs(tower: torch.nn.Module, grid_thw: torch.Tensor) -> dict[str, torch.Tensor]:
    """`cu_seqlens` (the patch offsets where images start and end, int32) and `position_ids` (patches x 2: each
    patch's row and column, patches ordered by merge block as the tower orders them)."""
    merge = tower.spatial_merge_size
    positions = []
    for frames, height, width in grid_thw.tolist():
        rows, cols = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
        blocks = [t.reshape(height // merge, merge, width // merge, merge).transpose(1, 2).flatten() for t in (rows, cols)]
        positions.append(torch.stack(blocks, dim=-1).repeat(frames, 1))
    lengths = (grid_thw[:, 1] * grid_thw[:, 2]).repeat_interleave(grid_thw[:, 0])
    cu_seqlens = torch.nn.functional.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))
    return {"cu_seqlens": cu_seqlens, "position_ids": torch.cat(positions)}


def run_tower(tower: torch.nn.Module, pixel_values, cu_seqlens, position_ids) -> torch.Tensor:
    """The tower's forward with `grid_inputs`' tensors given: one merged row per image token."""
    inv_freq = tower.rotary_pos_emb.inv_freq
    angles = (position_ids.to(inv_freq.dtype)[..., None] * inv_freq).flatten(1)
    angles = torch.cat((angles, angles), dim=-1)
    position_embeddings = (angles.cos(), angles.sin())
    hidden = tower.patch_embed(pixel_values)
    for block in tower.blocks:
        hidden = block(hidden, cu_seqlens=cu_seqlens, position_embeddings=position_embeddings)
    return tower.merger(hidden)


__all__ = ["TOWERS", "covers", "grid_inputs", "run_tower"]
