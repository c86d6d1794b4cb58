"""Mamba caches and mixers of transformers 4.

An exported Mamba graph advances its state one token at a time from a zero state (see
docs/caches.md, "State caches"). transformers 4 writes the new conv column at
`clamp(cache_position, 0, kernel - 1)` after rolling the window, which is the last slot for every
decode step `generate` makes (its positions start at the kernel size) but not for a zero state
stepped from position 0. The patch always writes the last slot: generate's decode semantics at
every position. (transformers 5 keeps the state in `DynamicCache` and needs no patch.)

The Mamba-2 mixers (mamba2, bamba, falcon_h1, granitemoehybrid) choose their single-token path with
`cache_position[0] > 0`, a branch on a value torch.export cannot take. The exported graph always steps one
token onto a state, and from a zero state that path computes what the prompt path does (the rolled window
and the recurrence start from zeros). On single-token calls with a cache the mixer is given a stand-in
position that is past the prompt; other calls are unchanged.

Falcon-H1's hybrid cache tells a skipped layer's `[]` from its keys with `len(...) == 0`: the batch size, read
as an int, which fixes the batch axis. A layer holding keys is concatenated without asking."""

import torch

from .registry import original, register_patch

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


class _AfterPrefill:
    """Stands for a `cache_position` whose first value is > 0 (the only use these mixers make of it)."""

    def __getitem__(self, index):
        return self

    def __gt__(self, other):
        return True


_MIXER_REASON = "single-token path chosen by cache_position's value -> by the call's shape"
_MIXERS = {"bamba.modeling_bamba.BambaMixer", "falcon_h1.modeling_falcon_h1.FalconH1Mixer",
           "granitemoehybrid.modeling_granitemoehybrid.GraniteMoeHybridMambaLayer"}


def _stepped(states, cache_params, cache_position):
    return _AfterPrefill() if cache_params is not None and cache_position is not None and states.shape[1] == 1 \
        else cache_position


_MAMBA2 = "transformers.models.mamba2.modeling_mamba2.Mamba2Mixer.torch_forward"


@register_patch(_MAMBA2, versions=_V4, reason=_MIXER_REASON)
def mamba2_stepped_mixer(self, hidden_states, cache_params=None, cache_position=None, attention_mask=None):
    return original(_MAMBA2)(
        self, hidden_states, cache_params, _stepped(hidden_states, cache_params, cache_position), attention_mask)


def hybrid_stepped_mixer(self, input_states, cache_params=None, cache_position=None, attention_mask=None):
    target = f"{type(self).__module__}.{type(self).__qualname__}.torch_forward"
    return original(target)(self, input_states, cache_params, _stepped(input_states, cache_params, cache_position),
                            attention_mask)


for _mixer in sorted(_MIXERS):
    register_patch(f"transformers.models.{_mixer}.torch_forward", versions=_V4, reason=_MIXER_REASON)(hybrid_stepped_mixer)


@register_patch("transformers.models.falcon_h1.modeling_falcon_h1.FalconHybridMambaAttentionDynamicCache.update",
                versions=_V4, reason="skipped layer told by len(keys), the batch size -> by the slot being a tensor")
def falcon_h1_cache_update(self, key_states, value_states, layer_idx, cache_kwargs=None):
    if layer_idx < len(self.key_cache) and isinstance(self.key_cache[layer_idx], torch.Tensor):
        self.key_cache[layer_idx] = torch.cat([self.key_cache[layer_idx], key_states], dim=-2)
        self.value_cache[layer_idx] = torch.cat([self.value_cache[layer_idx], value_states], dim=-2)
        return self.key_cache[layer_idx], self.value_cache[layer_idx]
    return original("transformers.models.falcon_h1.modeling_falcon_h1.FalconHybridMambaAttentionDynamicCache.update")(
        self, key_states, value_states, layer_idx, cache_kwargs)
