"""RWKV's token shift on a single-token step with a state.

A step of one token takes the previous token's hidden state from `state` as `[batch, hidden]` and mixes it
with the `[batch, 1, hidden]` input: broadcast, that is `[batch, batch, hidden]`, so with more than one row
every row mixes every row's previous token (the logits come out `[batch, batch, vocab]`). The patch shifts
by one token the same way for every length (the state's column in front of the tokens), which is what
several tokens at once already do; one row is unchanged. (transformers 4.44 to 5.23 at least.)"""

import torch

from .registry import register_patch

_VERSIONS = {"transformers": ">=4.44"}
_REASON = "single-token step with a state: the shifted token kept per row ([batch, 1, hidden])"


def _shifted(module, hidden, state, index):
    if state is None:
        return module.time_shift(hidden)  # the first token follows zeros
    return torch.cat([state[index][:, :, module.layer_id].unsqueeze(1).to(hidden.dtype), hidden[:, :-1]], dim=1)


@register_patch("transformers.models.rwkv.modeling_rwkv.RwkvSelfAttention.extract_key_value", versions=_VERSIONS,
                reason=_REASON)
def rwkv_attention_shift(self, hidden, state=None):
    shifted = _shifted(self, hidden, state, 1)
    key = self.key(hidden * self.time_mix_key + shifted * (1 - self.time_mix_key))
    value = self.value(hidden * self.time_mix_value + shifted * (1 - self.time_mix_value))
    receptance = torch.sigmoid(self.receptance(hidden * self.time_mix_receptance + shifted * (1 - self.time_mix_receptance)))
    if state is not None:
        state[1][:, :, self.layer_id] = hidden[:, -1]
    return receptance, key, value, state


@register_patch("transformers.models.rwkv.modeling_rwkv.RwkvFeedForward.forward", versions=_VERSIONS, reason=_REASON)
def rwkv_feed_forward_shift(self, hidden, state=None):
    shifted = _shifted(self, hidden, state, 0)
    key = torch.square(torch.relu(self.key(hidden * self.time_mix_key + shifted * (1 - self.time_mix_key))))
    receptance = torch.sigmoid(self.receptance(hidden * self.time_mix_receptance + shifted * (1 - self.time_mix_receptance)))
    if state is not None:
        state[0][:, :, self.layer_id] = hidden[:, -1]
    return receptance * self.value(key), state
