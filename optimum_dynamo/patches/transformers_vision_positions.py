"""Positions of the patches of several images (Idefics2, Idefics3, SmolVLM on transformers 4).

transformers 4.57 computes each image's patch positions in a Python loop over the images, with
`torch.arange(mask.sum())`: torch.export unrolls the loop, so the number of images (tiles) of the vision
graph is fixed to the sample's. The replacement computes the same positions for all images at once (on the
full patch grid, kept where the patch mask is set, as transformers 5 does), with 4.57's arithmetic
(`index / count * (1 - 1e-6)`), so the number of images stays a dynamic axis. The processor's masks are
top-left rectangles (an image padded at its bottom and right), where both give the same positions."""

import torch

from .registry import register_patch

_V4 = {"transformers": ">=4.57,<5"}  # measured on 4.57; transformers 5 has no loop
_REASON = "a Python loop over images fixes their number -> the positions of all images at once"


def _positions(self, pixel_values, patch_attention_mask):
    batch, _, height, width = pixel_values.shape
    patches = self.patch_embedding(pixel_values).flatten(2).transpose(1, 2)
    side = self.num_patches_per_side
    boundaries = torch.arange(1 / side, 1.0, 1 / side, device=pixel_values.device)
    rows = torch.arange(height // self.patch_size, device=pixel_values.device, dtype=pixel_values.dtype)
    cols = torch.arange(width // self.patch_size, device=pixel_values.device, dtype=pixel_values.dtype)
    counts_h = patch_attention_mask[:, :, 0].sum(1).to(rows.dtype)  # float: exact, and no integer Div in ONNX
    counts_w = patch_attention_mask[:, 0, :].sum(1).to(cols.dtype)
    fraction_h = rows[None, :] / counts_h[:, None] * (1 - 1e-6)
    fraction_w = cols[None, :] / counts_w[:, None] * (1 - 1e-6)
    bucket_h = torch.bucketize(fraction_h, boundaries, right=True)
    bucket_w = torch.bucketize(fraction_w, boundaries, right=True)
    ids = (bucket_h[:, :, None] * side + bucket_w[:, None, :]).reshape(batch, -1)
    ids = torch.where(patch_attention_mask.reshape(batch, -1), ids, torch.zeros_like(ids))
    return patches + self.position_embedding(ids)


@register_patch("transformers.models.idefics3.modeling_idefics3.Idefics3VisionEmbeddings.forward", versions=_V4,
                reason=_REASON)
def idefics3_patch_positions(self, pixel_values, patch_attention_mask):
    return _positions(self, pixel_values, patch_attention_mask)


@register_patch("transformers.models.smolvlm.modeling_smolvlm.SmolVLMVisionEmbeddings.forward", versions=_V4,
                reason=_REASON)
def smolvlm_patch_positions(self, pixel_values, patch_attention_mask):
    return _positions(self, pixel_values, patch_attention_mask)


@register_patch("transformers.models.idefics2.modeling_idefics2.Idefics2VisionEmbeddings.forward", versions=_V4,
                reason=_REASON)
def idefics2_patch_positions(self, pixel_values, patch_attention_mask):
    return _positions(self, pixel_values, patch_attention_mask)
