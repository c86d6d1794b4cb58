"""TensorFlow-style "SAME" padding for any image size.

MobileNet v1 and v2 pad each strided convolution by `kernel - (size % stride)` (or `kernel - stride` when the size
divides), branching on the size and turning it into a Python `int`: torch.export fixes the image size to the
captured one ("the model's code fixes pixel_values's ..."). `(size - 1) % stride + 1` is that remainder, or the
stride when it divides, so the same padding comes from size arithmetic without a branch, and stays symbolic.
(transformers 4.53 to 5.24 at least.)"""

from __future__ import annotations

import torch

from .registry import register_patch


def _along(size, stride: int, kernel: int):
    padding = kernel - ((size - 1) % stride + 1)
    return padding if kernel >= stride else torch.sym_max(padding, 0)  # a remainder is at most the stride


def tf_same_padding(features, conv_layer):
    stride_height, stride_width = conv_layer.stride
    kernel_height, kernel_width = conv_layer.kernel_size
    dilation_height, dilation_width = conv_layer.dilation
    along_height = _along(features.shape[-2], stride_height, kernel_height)
    along_width = _along(features.shape[-1], stride_width, kernel_width)
    left, top = along_width // 2, along_height // 2
    padding = (left * dilation_width, (along_width - left) * dilation_width,
               top * dilation_height, (along_height - top) * dilation_height)
    return torch.nn.functional.pad(features, padding, "constant", 0.0)


for _version in ("v1", "v2"):
    register_patch(f"transformers.models.mobilenet_{_version}.modeling_mobilenet_{_version}.apply_tf_padding",
                   versions={"transformers": ">=4.53"},
                   reason="SAME padding from size arithmetic, not a branch on the image size")(tf_same_padding)
