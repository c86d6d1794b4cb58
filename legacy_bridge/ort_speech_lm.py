"""`ORTModelForSpeechSeq2Seq` of optimum-onnx 0.1.0 (and main at 1939f27) on speech LLMs.

transformers 5 maps speech LLMs (Voxtral, Qwen3-ASR, GLM-ASR, ...), decoders fed audio features, among its speech
seq2seq models; optimum's class loads encoder-decoder graphs only, choosing Whisper's and Moonshine's own classes by
model type in `_from_pretrained`. The wrapper does the same for a speech LLM's config: the loader optimum_dynamo
registers when activated (`use`: its `ORTModelForSpeechLM`) loads the components `--dynamo` exported for it.
"""

from __future__ import annotations

from typing import Callable

from .hooks import MethodPatch

_MODULE = "optimum.onnxruntime.modeling_seq2seq"
LOADERS: list[Callable] = []  # (model_id, config, **kwargs) -> the runtime model; none: optimum's own path


def use(load: Callable) -> None:
    LOADERS[:] = [load]


def audio_token_id(config) -> int | None:
    for name in ("audio_token_id", "audio_token_index"):
        if getattr(config, name, None) is not None:
            return getattr(config, name)
    return None


def speech_lm(config) -> bool:
    """A decoder-only model whose audio features replace audio-token rows (its config names the audio token)."""
    return not getattr(config, "is_encoder_decoder", False) and audio_token_id(config) is not None


def _apply(cls, original: dict) -> None:
    load = original["_from_pretrained"] = cls.__dict__["_from_pretrained"]

    def _from_pretrained(cls, model_id, config, **kwargs):
        if speech_lm(config) and LOADERS:
            return LOADERS[0](model_id, config, **kwargs)
        return load.__func__(cls, model_id, config, **kwargs)

    cls._from_pretrained = classmethod(_from_pretrained)


PATCH = MethodPatch(_MODULE, "ORTModelForSpeechSeq2Seq", _apply)

install, uninstall = PATCH.install, PATCH.uninstall
