"""Tensors made from symbolic sizes stay symbolic.

Under torch.export these turn a size into the captured number, and the graph then holds the capture's image size
(onnxruntime: "Attempting to broadcast an axis by a dimension other than 1" on another size):
- `torch.as_tensor(sizes)` / `torch.tensor(sizes)` on a list of sizes (Deformable DETR's and Mask2Former's
  `spatial_shapes`: each feature map's height and width): where the data holds a `SymInt`, the same tensor is built
  from `torch.full` of each size, which torch.export keeps symbolic;
- `torch.linspace(start, end, steps)` with a symbolic `steps` (their reference points, one per pixel): the same
  values from `torch.arange(steps)`.
Any other call goes to the original. (torch 2.13 to 2.15.)"""

from __future__ import annotations

import torch

from .registry import original, register_patch


def _leaves(data) -> list:
    return [leaf for item in data for leaf in _leaves(item)] if isinstance(data, (list, tuple)) else [data]


def _sizes(data) -> bool:
    """Integers only, at least one of them symbolic."""
    leaves = _leaves(data)
    return any(isinstance(x, torch.SymInt) for x in leaves) and all(isinstance(x, (int, torch.SymInt)) for x in leaves)


def _built(data, dtype, device) -> torch.Tensor:
    if isinstance(data, (list, tuple)):
        return torch.stack([_built(item, dtype, device) for item in data])
    return torch.full((), data, dtype=dtype, device=device)


def _from_sizes(target: str):
    def tensor_of_sizes(data, *args, dtype=None, device=None, **kwargs):
        if args or kwargs or not isinstance(data, (list, tuple)) or not data or not _sizes(data):
            return original(target)(data, *args, dtype=dtype, device=device, **kwargs)
        return _built(data, dtype or torch.long, device)

    return tensor_of_sizes


@register_patch("torch.linspace", versions={"torch": ">=2.13"}, check_signature=False,
                reason="evenly spaced values over a symbolic count from arange, not from the captured count")
def linspace_of_a_size(start, end, steps, *args, dtype=None, device=None, **kwargs):
    if args or kwargs or not isinstance(steps, torch.SymInt):
        return original("torch.linspace")(start, end, steps, *args, dtype=dtype, device=device, **kwargs)
    dtype = dtype or torch.get_default_dtype()
    step = (end - start) / torch.clamp(torch.full((), steps - 1, dtype=dtype, device=device), min=1)
    return start + torch.arange(steps, dtype=dtype, device=device) * step


for _target in ("torch.as_tensor", "torch.tensor"):
    register_patch(_target, versions={"torch": ">=2.13"}, check_signature=False,
                   reason="a tensor of symbolic sizes built from torch.full, not from the captured numbers"
                   )(_from_sizes(_target))
