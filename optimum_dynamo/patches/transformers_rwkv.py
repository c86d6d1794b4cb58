"""RWKV under torch.export: its token shift on a single-token step, and its WKV recurrence over a sequence.

A step of one token takes the previous token's hidden state from `state` as `[batch, hidden]` and mixes it
with the `[batch, 1, hidden]` input: broadcast, that is `[batch, batch, hidden]`, so with more than one row
every row mixes every row's previous token (the logits come out `[batch, batch, vocab]`). The patch shifts
by one token the same way for every length (the state's column in front of the tokens), which is what
several tokens at once already do; one row is unchanged. (transformers 4.44 to 5.23 at least.)

The WKV attention's CPU path (`rwkv_linear_attention_cpu`) loops over the length in Python: torch.export unrolls
it at the capture's length, which fixes the sequence axis of a whole-sequence call (feature extraction). Longer
than one token, the same recurrence runs through `torch.scan` (an ONNX `Scan`), with the same float32 states and
the same numerically stable form. (transformers 4.57 to 5.24 at least.)"""

import torch
from torch._higher_order_ops import scan

from .registry import original, register_patch

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


_WKV = "transformers.models.rwkv.modeling_rwkv.rwkv_linear_attention_cpu"


def _wkv_step(carry, x):
    numerator, denominator, largest = carry
    key, value, first, decay = x
    top = torch.maximum(largest, key + first)  # this token's output
    a, b = torch.exp(largest - top), torch.exp(key + first - top)
    output = (a * numerator + b * value) / (a * denominator + b)
    top = torch.maximum(largest + decay, key)  # the state after it
    a, b = torch.exp(largest + decay - top), torch.exp(key - top)
    return (a * numerator + b * value, a * denominator + b, top), output


@register_patch(_WKV, versions={"transformers": ">=4.57"}, reason="the WKV loop over the length -> torch.scan")
def rwkv_wkv_scan(time_decay, time_first, key, value, state=None, return_state=False):
    if key.size(1) == 1:  # a step: nothing to loop over
        return original(_WKV)(time_decay, time_first, key, value, state=state, return_state=return_state)
    given = state is not None
    if not given:
        state = [torch.zeros_like(key[:, 0], dtype=torch.float32) + fill for fill in (0, 0, -1e38)]  # 3 tensors
    keys = key.float().movedim(1, 0)  # (length, batch, hidden)
    per_token = (keys, value.movedim(1, 0), time_first.expand_as(keys), (-torch.exp(time_decay)).expand_as(keys))
    carry = tuple(s.contiguous() for s in state)  # a given state is a layer's slice of the model's
    (numerator, denominator, largest), outputs = scan(_wkv_step, carry, per_token)
    state = [numerator, denominator, largest] if return_state or given else None
    return outputs.movedim(0, 1).to(key.dtype), state
