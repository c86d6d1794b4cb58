"""Transformers 4.57's Qwen2-VL, Qwen2.5-VL and Qwen3-VL vision towers on inputs derived outside their graph.

transformers >= 5 lets the tower take what it derives from the image grid (`cu_seqlens`, the rotary
`position_ids`) as inputs (`precompute_export_inputs`), so the graph keeps the number of images and their sizes
dynamic. 4.57's towers derive them inside `forward` from the grid's values, which torch.export would fix. Here
the same tensors are made from the grid in Python (`grid_inputs`; Qwen2.5-VL's windows by the tower's own
`get_window_index`; Qwen3-VL's bilinear corners of its learned position table, indices and weights), and
`run_tower` runs the tower's own modules on them: patch embedding (plus the interpolated positions), blocks
(Qwen2.5-VL: on the patches in window order, windowed except its full-attention layers; Qwen3-VL: DeepStack
mergers after some), merger. The rotary angles are `position * inv_freq`, the entries of the table 4.57 builds and
indexes (the same products, bit for bit).
"""

from __future__ import annotations

import importlib.util

import torch

TOWERS = ("Qwen2VisionTransformerPretrainedModel", "Qwen2_5_VisionTransformerPretrainedModel", "Qwen3VLVisionModel")


def covers(tower: torch.nn.Module) -> bool:
    """A tower of `TOWERS` on a transformers without `precompute_export_inputs` (which the newer tower takes)."""
    return type(tower).__name__ in TOWERS and importlib.util.find_spec("transformers.exporters") is None


def _merge_order(t: torch.Tensor, merge: int) -> torch.Tensor:
    """(..., height, width) -> (..., patches): patches ordered by merge block, as the towers order them."""
    *lead, height, width = t.shape
    return t.reshape(*lead, height // merge, merge, width // merge, merge).transpose(-3, -2).flatten(-4)


def _interpolation(tower: torch.nn.Module, frames: int, height: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3-VL: the 4 bilinear corners of each patch in the tower's square position table, (4, patches) indices
    and weights, corners in the order (top, left), (top, right), (bottom, left), (bottom, right)."""
    side = tower.num_grid_per_side
    axes = []
    for size in (height, width):
        at = torch.linspace(0, side - 1, size)
        low = at.int()
        axes.append(((low, 1 - (at - low)), ((low + 1).clip(max=side - 1), at - low)))
    (top, left) = axes
    indices = [(h[:, None] * side + w[None, :]).long() for h, _ in top for w, _ in left]
    weights = [hw[:, None] * ww[None, :] for _, hw in top for _, ww in left]
    return tuple(_merge_order(torch.stack(t)[:, None].expand(-1, frames, -1, -1), tower.spatial_merge_size).flatten(1)
                 for t in (indices, weights))


def grid_inputs(tower: torch.nn.Module, grid_thw: torch.Tensor) -> dict[str, torch.Tensor]:
    """`cu_seqlens` (the patch offsets where images start and end, int32) and `position_ids` (patches x 2: each
    patch's row and column, patches ordered by merge block as the tower orders them), and what the tower derives
    besides."""
    merge = tower.spatial_merge_size
    positions, corners = [], []
    for frames, height, width in grid_thw.tolist():
        rows, cols = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
        positions.append(torch.stack([_merge_order(t, merge) for t in (rows, cols)], dim=-1).repeat(frames, 1))
        if hasattr(tower, "num_grid_per_side"):
            corners.append(_interpolation(tower, frames, height, width))
    lengths = (grid_thw[:, 1] * grid_thw[:, 2]).repeat_interleave(grid_thw[:, 0])
    cu_seqlens = torch.nn.functional.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))
    inputs = {"cu_seqlens": cu_seqlens, "position_ids": torch.cat(positions)}
    if corners:  # Qwen3-VL: its position table, interpolated to each image's grid
        inputs["interp_indices"] = torch.cat([i for i, _ in corners], dim=1)
        inputs["interp_weights"] = torch.cat([w for _, w in corners], dim=1).to(tower.pos_embed.weight.dtype)
    if hasattr(tower, "get_window_index"):  # Qwen2.5-VL: merged patches in window order, and the windows' bounds
        window_index, bounds = tower.get_window_index(grid_thw)
        inputs["window_index"] = window_index
        inputs["cu_window_seqlens"] = torch.unique_consecutive(torch.tensor(bounds, dtype=torch.int32))
    return inputs


def run_tower(tower: torch.nn.Module, pixel_values, cu_seqlens, position_ids, window_index=None,
              cu_window_seqlens=None, interp_indices=None, interp_weights=None):
    """The tower's forward with `grid_inputs`' tensors given: one merged row per image token, images in order (and
    Qwen3-VL's DeepStack features, (layers, rows, hidden))."""
    inv_freq = tower.rotary_pos_emb.inv_freq
    angles = (position_ids.to(inv_freq.dtype)[..., None] * inv_freq).flatten(1)
    hidden = tower.patch_embed(pixel_values)
    if interp_indices is not None:  # the corners' rows of the position table, weighted, summed in corner order
        corner = [tower.pos_embed(i) * w[:, None] for i, w in zip(interp_indices, interp_weights)]
        hidden = hidden + (corner[0] + corner[1] + corner[2] + corner[3])
    if window_index is not None:  # whole merge units in window order
        unit = tower.spatial_merge_unit
        hidden, angles = (t.reshape(t.shape[0] // unit, unit, -1)[window_index].flatten(0, 1) for t in (hidden, angles))
    angles = torch.cat((angles, angles), dim=-1)
    position_embeddings = (angles.cos(), angles.sin())
    full = getattr(tower, "fullatt_block_indexes", range(len(tower.blocks)))
    deepstack = list(getattr(tower, "deepstack_visual_indexes", []))
    features = []
    for layer, block in enumerate(tower.blocks):
        bounds = cu_seqlens if window_index is None or layer in full else cu_window_seqlens
        hidden = block(hidden, cu_seqlens=bounds, position_embeddings=position_embeddings)
        if layer in deepstack:
            features.append(tower.deepstack_merger_list[deepstack.index(layer)](hidden))
    merged = tower.merger(hidden)
    if features:
        return {"output": merged, "deepstack_features": torch.stack(features)}
    return merged if window_index is None else merged[torch.argsort(window_index)]


__all__ = ["TOWERS", "covers", "grid_inputs", "run_tower"]
