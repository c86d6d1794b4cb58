"""Pixtral's block-diagonal attention mask (each image attends to itself).

`generate_block_attention_mask` fills the mask with one slice assignment per image; with image sizes that
are dynamic axes, the slice bounds become data-dependent in torch.export. The patch compares each position's
image index (how many image ends lie at or before it) instead: the same mask, from tensor ops."""

import torch

from .registry import register_patch


@register_patch("transformers.models.pixtral.modeling_pixtral.generate_block_attention_mask",
                versions={"transformers": ">=4.57"}, reason="slice assignments per image -> image-index comparison")
def block_mask_by_image_index(patch_embeds_list, tensor):
    positions = torch.arange(tensor.shape[1], device=tensor.device)
    image = torch.zeros_like(positions)
    end = 0
    for num_patches in patch_embeds_list[:-1]:
        end = end + num_patches
        image = image + (positions >= end).long()
    same = image[:, None] == image[None, :]
    mask = torch.zeros(same.shape, dtype=tensor.dtype, device=tensor.device).masked_fill(~same, torch.finfo(tensor.dtype).min)
    return mask[None, None, :, :].expand(tensor.shape[0], 1, -1, -1)
