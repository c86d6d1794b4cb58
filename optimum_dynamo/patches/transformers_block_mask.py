"""Pixtral's vision tower: its block-diagonal attention mask (each image attends to itself), and batches of whole
images.

`generate_block_attention_mask` fills the mask with one slice assignment per image; with image sizes that
are dynamic axes, the slice bounds become data-dependent in torch.export. The patch compares each position's
image index (how many image ends lie at or before it) instead: the same mask, from tensor ops.

Called without `image_sizes` (feature extraction: a batch of whole images of one size), `PixtralVisionModel`
still crops and flattens image by image in a Python loop over the batch, which fixes the batch in torch.export.
The patch packs the batch's patches with one reshape, repeats one image's positions for each, and gives each
image its block of the mask by its index: the same packed sequence, positions and mask. With `image_sizes` (the
VLMs), or flash attention, the original runs."""

import torch

from .registry import original, register_patch

_MODEL = "transformers.models.pixtral.modeling_pixtral"
_FORWARD = f"{_MODEL}.PixtralVisionModel.forward"
_WHOLE = "whole images: packed by a reshape, not a loop over the batch"


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


def _packed(self, pixel_values):
    """(patches of the batch packed in one sequence, normed; one image's patches (channels, rows, columns); the
    additive block mask of the images)."""
    embeds = self.patch_conv(pixel_values.to(dtype=self.patch_conv.weight.dtype))
    batch, channels, rows, columns = embeds.shape
    packed = self.ln_pre(embeds.flatten(2).transpose(1, 2).reshape(1, batch * rows * columns, channels))
    image = torch.arange(packed.shape[1], device=packed.device) // (rows * columns)
    dtype = packed.dtype
    mask = torch.zeros((), dtype=dtype).masked_fill(image[:, None] != image[None, :], torch.finfo(dtype).min)
    return packed, embeds[0], mask[None, None], batch


@register_patch(_FORWARD, versions={"transformers": ">=4.57,<5"}, reason=_WHOLE)
def pixtral_whole_images_v4(self, pixel_values, image_sizes=None, output_hidden_states=None, output_attentions=None,
                            return_dict=None, *args, **kwargs):
    if image_sizes is not None or self.config._attn_implementation == "flash_attention_2":
        return original(_FORWARD)(self, pixel_values, image_sizes, output_hidden_states, output_attentions,
                                  return_dict, *args, **kwargs)
    from transformers.models.pixtral.modeling_pixtral import position_ids_in_meshgrid

    packed, one, mask, batch = _packed(self, pixel_values)
    kwargs["position_ids"] = position_ids_in_meshgrid(
        [one], max_width=self.config.image_size // self.config.patch_size).repeat(batch)
    return self.transformer(packed, attention_mask=mask,
                            position_embeddings=self.patch_positional_embedding(packed, kwargs["position_ids"]),
                            output_hidden_states=output_hidden_states, output_attentions=output_attentions,
                            return_dict=True, **kwargs)


@register_patch(_FORWARD, versions={"transformers": ">=5"}, reason=_WHOLE)
def pixtral_whole_images(self, pixel_values, image_sizes=None, **kwargs):
    from transformers.models.pixtral import modeling_pixtral

    flash = getattr(modeling_pixtral, "is_flash_attention_requested", lambda config: False)(self.config)
    if image_sizes is not None or flash:
        return original(_FORWARD)(self, pixel_values, image_sizes, **kwargs)
    packed, one, mask, batch = _packed(self, pixel_values)
    rows, columns = torch.meshgrid(torch.arange(one.shape[-2], device=packed.device),
                                   torch.arange(one.shape[-1], device=packed.device), indexing="ij")
    positions = torch.stack([rows.flatten(), columns.flatten()], dim=-1).repeat(batch, 1)
    return self.transformer(packed, attention_mask=mask,
                            position_embeddings=self.patch_positional_embedding(packed, positions), **kwargs)
