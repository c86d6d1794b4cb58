"""Mamba caches of transformers 4 (`MambaCache`, `FalconMambaCache`).

An exported Mamba graph advances its state one token at a time from a zero state (see
docs/caches.md, "State caches"). transformers 4 writes the new conv column at
`clamp(cache_position, 0, kernel - 1)` after rolling the window, which is the last slot for every
decode step `generate` makes (its positions start at the kernel size) but not for a zero state
stepped from position 0. The patch always writes the last slot: generate's decode semantics at
every position. (transformers 5 keeps the state in `DynamicCache` and needs no patch.)"""

import torch

from .registry import register_patch

_V4 = {"transformers": ">=4.44,<5"}
_V4_FALCON = {"transformers": ">=4.54,<5"}  # before, falcon_mamba used MambaCache (patched above)
_REASON = "conv window written at the last slot whatever the position (a state stepped from zero)"


def _update_conv_state(self, layer_idx, new_conv_state, cache_position):
    conv_state = self.conv_states[layer_idx]
    if cache_position.shape[0] == self.conv_kernel_size:  # prefill: the whole window is given
        window = new_conv_state.to(dtype=conv_state.dtype)
    else:
        window = torch.cat([conv_state[:, :, 1:], new_conv_state.to(dtype=conv_state.dtype)[:, :, -1:]], dim=-1)
    self.conv_states[layer_idx].zero_()
    self.conv_states[layer_idx] += window
    return self.conv_states[layer_idx]


@register_patch("transformers.models.mamba.modeling_mamba.MambaCache.update_conv_state", versions=_V4, reason=_REASON)
def mamba_conv_window(self, layer_idx, new_conv_state, cache_position):
    return _update_conv_state(self, layer_idx, new_conv_state, cache_position)


@register_patch(
    "transformers.models.falcon_mamba.modeling_falcon_mamba.FalconMambaCache.update_conv_state",
    versions=_V4_FALCON,
    reason=_REASON,
)
def falcon_mamba_conv_window(self, layer_idx, new_conv_state, cache_position):
    return _update_conv_state(self, layer_idx, new_conv_state, cache_position)
