"""Any-resolution tiles (LLaVA-Next's family): the processor cuts an image into tiles by its size (a grid
chosen from `image_grid_pinpoints`, plus the whole image resized), the vision tower and the projector run on
the tiles, and the model packs each image's tile features into its rows: the grid joined, unpadded to the
image's aspect, a newline row after each line (`pack_image_features`, a Python loop over the sizes).

The graphs take tiles, any number of them (`vision_encoder`, `multi_modal_projector`); the runtime counts each
image's tiles and packs them with the model's own functions, run on the model built on the meta device, so
the tile count and the unpadding are data, not constants of the export. The packing's one weight, the newline
row, is an output of the projector's graph.
"""

from __future__ import annotations

import inspect
import sys

import torch

NEWLINE = "image_newline"


def covers(inner: torch.nn.Module) -> bool:
    """Whether the inner model packs tiles the way this module replays (its modeling module counts the tiles)."""
    module = sys.modules.get(type(inner).__module__)
    return (isinstance(getattr(inner, NEWLINE, None), torch.Tensor) and callable(getattr(inner, "pack_image_features", None))
            and hasattr(module, "image_size_to_num_patches") and hasattr(inner.config, "image_grid_pinpoints"))


def tile_counts(inner: torch.nn.Module, image_sizes, batch_num_images=None) -> list[int]:
    """How many tiles the processor made of each image: the model's own count from its size, or one tile for
    the images of a prompt with several (`batch_num_images`, LLaVA-OneVision's processor)."""
    count = sys.modules[type(inner).__module__].image_size_to_num_patches
    config = inner.config
    tiled = [True] * len(image_sizes) if batch_num_images is None else [n == 1 for n in batch_num_images.tolist() for _ in range(n)]
    return [int(count(image_size=size, grid_pinpoints=config.image_grid_pinpoints, patch_size=config.vision_config.image_size))
            if whole else 1 for size, whole in zip(image_sizes, tiled)]


def real_tiles(pixel_values: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """(images, tiles padded to the batch's most, C, H, W) -> (every image's own tiles, C, H, W), as the model does."""
    if pixel_values.dim() == 4:
        return pixel_values
    return torch.cat([pixels[:count] for pixels, count in zip(pixel_values, counts)])


def pack(inner: torch.nn.Module, features: torch.Tensor, image_sizes, counts: list[int], newline: torch.Tensor) -> torch.Tensor:
    """Tile features (tiles, rows per tile, hidden), `counts` per image -> the rows that replace the image tokens, all
    images in order, by the model's `pack_image_features` (its options from the config, as the model passes them)."""
    parts = list(torch.split(features, counts))
    params = inspect.signature(inner.pack_image_features).parameters
    config, options = inner.config, {}
    for name in ("vision_feature_select_strategy", "vision_aspect_ratio"):
        if name in params and getattr(config, name, None) is not None:
            options[name] = getattr(config, name)
    rows, _ = inner.pack_image_features(parts, image_sizes, image_newline=newline, **options)
    return torch.cat(rows) if isinstance(rows, (list, tuple)) else rows  # transformers 5: one tensor per image


class TiledProjector(torch.nn.Module):
    """The projector over the tiles' features, with the newline row the packing adds as a second output."""

    def __init__(self, projector: torch.nn.Module, newline: torch.Tensor):
        super().__init__()
        self.projector, self.newline = projector, newline

    def forward(self, features):
        return {"output": self.projector(features), NEWLINE: self.newline}
