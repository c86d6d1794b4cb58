"""Missing attention mask in ORTModelForCausalLM.forward (optimum-onnx 0.1.0).

transformers >= 5.0 `generate()` drops an all-ones attention mask (seen on 5.23: it sets it to None
after computing position_ids), but a graph with an `attention_mask` input requires one, so the runtime
raised "Input attention_mask is required by model but not provided". The wrapper feeds ones over the
past and new tokens, which is what the dropped mask held.
"""

from __future__ import annotations

import functools

from ._hooks import when_imported

_MODULE = "optimum.onnxruntime.modeling_decoder"
_installed = False


def _past_length(past_key_values) -> int:
    if not past_key_values:
        return 0
    first = past_key_values[0]
    return (first[1] if isinstance(first, (tuple, list)) else first).shape[-2]


def _patch(module) -> None:
    cls = module.ORTModelForCausalLM
    original = cls.forward

    import torch

    @functools.wraps(original)
    def forward(self, input_ids, attention_mask=None, past_key_values=None, *args, **kwargs):
        if attention_mask is None and "attention_mask" in self.input_names:
            batch, length = input_ids.shape
            attention_mask = torch.ones(batch, _past_length(past_key_values) + length, dtype=torch.long)
        return original(self, input_ids, attention_mask, past_key_values, *args, **kwargs)

    cls.forward = forward


def install() -> None:
    global _installed
    if not _installed:
        _installed = True
        when_imported(_MODULE, _patch)
