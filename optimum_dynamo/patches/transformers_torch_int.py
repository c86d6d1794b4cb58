"""Sizes kept symbolic by `torch_int`.

transformers' `torch_int(x)` turns a size into a Python `int` unless torch.jit traces. Under torch.export a size of
a dynamic axis is a `SymInt`, and `int()` fixes it to the captured value: DINOv2 with registers interpolates its
position embeddings to `torch_int(height)` patches, and the graph then holds the capture's image size for every
image (onnxruntime: "Attempting to broadcast an axis by a dimension other than 1").
A `SymInt` is returned as it is; any other value as before. (transformers 4.53 to 5.24 at least: 60 modeling
modules import it.)"""

from __future__ import annotations

import torch

from .registry import original, register_patch

_TORCH_INT = "transformers.utils.generic.torch_int"


@register_patch(_TORCH_INT, versions={"transformers": ">=4.53"}, where_imported=True,
                reason="a symbolic size stays symbolic instead of becoming the captured value")
def symbolic_torch_int(x):
    return x if isinstance(x, torch.SymInt) else original(_TORCH_INT)(x)
