"""MEGA's EMA kernel computed for the sequence length at hand, not read from the module's cache.

In eval mode `MegaMultiDimensionDampedEma.get_ema_kernel` keeps the last kernel it computed (`self._kernel`) and
serves later calls a slice of it while it is long enough. The export runs the model eagerly first (capture), so
torch.export finds a concrete kernel of the capture's length, takes it as a constant and slices it to
min(length, that length): longer sequences then get a short kernel (onnxruntime: "Attempting to broadcast an axis
by a dimension other than 1. 17 by 18" between the two spectra multiplied in `fft_convolution`). Traced with no
kernel cached, it would instead leave a fake tensor in `self._kernel`. The patch always computes the kernel, as
training mode does (the values the cache holds: a function of the parameters and the length).
The FFT convolution itself is left to the original: its irfft is mended at the translation
(`exporters/onnx_passes/inverse_dft.py`). (transformers 4.57; MEGA is gone from 5.x.)"""

from __future__ import annotations

import torch

from .registry import register_patch

_TARGET = "transformers.models.deprecated.mega.modeling_mega.MegaMultiDimensionDampedEma.get_ema_kernel"
_REASON = "the EMA kernel from the sequence length, not a cached tensor of the capture's length"


@register_patch(_TARGET, versions={"transformers": ">=4.57,<5"}, reason=_REASON)
def mega_ema_kernel(self, length: int):
    kernel_size = length if self.truncation is None else torch.sym_min(self.truncation, length)
    return self._compute_efficient_ema_kernel(kernel_size)  # (it empties the cache: nothing stale is kept)
