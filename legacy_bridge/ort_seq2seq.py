"""The decoder of optimum-onnx 0.1.0's seq2seq runtime classes (and main at 1939f27) on configs that keep the
decoder's sizes in a sub-config.

`ORTDecoderForSeq2Seq.__init__` reads `num_attention_heads` and `hidden_size` from the config's `decoder`, else from
the top (the empty first-step cache's shape). transformers 5's NVIDIA Canary keeps them in `decoder_config` only:
`AttributeError: 'CanaryConfig' object has no attribute 'num_attention_heads'`. The wrapper copies the decoder's
sizes (`get_text_config(decoder=True)`) onto the loaded config object where the top has none (not saved).
"""

from __future__ import annotations

import functools

from .hooks import MethodPatch
from .ort_runtime import lift_text_sizes

_MODULE = "optimum.onnxruntime.modeling_seq2seq"


def _apply(cls, original: dict) -> None:
    init = original["__init__"] = cls.__init__

    @functools.wraps(init)
    def __init__(self, config, *args, **kwargs):
        if getattr(config, "decoder", None) is None:
            lift_text_sizes(config, decoder=True)
        init(self, config, *args, **kwargs)

    cls.__init__ = __init__


PATCH = MethodPatch(_MODULE, "ORTDecoderForSeq2Seq", _apply)
install, uninstall = PATCH.install, PATCH.uninstall
