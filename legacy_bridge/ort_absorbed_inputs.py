"""`generate` of optimum-onnx 0.1.0's `ORTModelForSpeechSeq2Seq` (and main at 1939f27) given a processor's whole
output.

Some feature extractors return bookkeeping beside the model's inputs, which the PyTorch class takes in its own
`prepare_inputs_for_generation` and drops: transformers 5's Cohere ASR returns `audio_chunk_index` (which chunk of
which clip each row is, for the processor's `decode`). optimum's class has no such parameter, and transformers'
`generate` refuses it: `ValueError: The following model_kwargs are not used by the model: ['audio_chunk_index']`.
The wrapper gives each loaded model a `generate` that drops what the PyTorch class for its config absorbs the same
way: the named parameters of its `prepare_inputs_for_generation` that neither its `forward` nor `GenerationMixin`'s
`prepare_inputs_for_generation` takes. Models whose class absorbs nothing keep optimum's `generate` untouched.
"""

from __future__ import annotations

import functools
import inspect

from .hooks import MethodPatch

_MODULE = "optimum.onnxruntime.modeling_seq2seq"
_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def absorbed(config) -> frozenset[str]:
    """The inputs the PyTorch speech seq2seq class for `config` takes in generation only to drop them."""
    from transformers import MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING, GenerationMixin

    try:
        model_class = MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING[type(config)]
    except (KeyError, ValueError):
        return frozenset()
    prepare = inspect.signature(model_class.prepare_inputs_for_generation).parameters
    taken = set(inspect.signature(model_class.forward).parameters)
    taken |= set(inspect.signature(GenerationMixin.prepare_inputs_for_generation).parameters)
    return frozenset(name for name, p in prepare.items() if p.kind in _NAMED and name not in taken)


def _apply(cls, original: dict) -> None:
    init = original["__init__"] = cls.__dict__["__init__"]

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        drop = absorbed(self.config)
        if drop:
            generate = self.generate

            @functools.wraps(generate)
            def generate_without(*args, **kwargs):
                return generate(*args, **{k: v for k, v in kwargs.items() if k not in drop})

            self.generate = generate_without

    cls.__init__ = __init__


PATCH = MethodPatch(_MODULE, "ORTModelForSpeechSeq2Seq", _apply)
install, uninstall = PATCH.install, PATCH.uninstall
