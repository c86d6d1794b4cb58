"""Speech LLMs: an audio tower feeding a text decoder (GLM-ASR, AudioFlamingo 3, Qwen2-Audio, Voxtral, ...), the
audio features replacing the rows of the prompt's audio tokens. The components are observed during one real
`generate` on two clips, each exported and checked by onnxruntime on its calls, as vision-language models are:

- `audio_features`: the model's own `get_audio_features` (tower, projector, the rows of the valid frames), the
  processor's features and their mask -> one row per audio token, the clips in order;
- `embed_tokens`, `decoder_model`: as for vision-language models (`vision_language.TextDecoder`).

`speech_lm.json` tells the runtime (`optimum_dynamo.ORTModelForSpeechLM`, which optimum's
`ORTModelForSpeechSeq2Seq.from_pretrained` returns for such a directory) how to join them.
"""

from __future__ import annotations

import inspect
import logging
from pathlib import PurePosixPath

import numpy as np
import torch

from legacy_bridge.ort_speech_lm import audio_token_id, speech_lm

from ..capture import Call, InputObserver, observe
from ..capture.drivers import Generation, greedy
from ..errors import ExportError
from .base import ExportContext, load_weights
from .component import Component
from .vision_language.exporter import (DECODER_INPUTS, TextDecoder, VlmOnnxExporter, check_decoder, decoder_calls,
                                       holds_embeddings)
from .vision_language.image_features import merged_rows, taking

logger = logging.getLogger(__name__)

LAYOUT_FILE = "speech_lm.json"
SAMPLING_RATE = 16000


def default_clips(rate: int = SAMPLING_RATE, seconds: tuple[float, ...] = (1.0, 0.6), seed: int = 0) -> list:
    """Synthesized clips (noise at speech level) of other lengths, for observation runs without real ones."""
    rng = np.random.default_rng(seed)
    return [(0.1 * rng.standard_normal(int(rate * s))).astype(np.float32) for s in seconds]


def sampling_rate(processor) -> int:
    """The rate of the processor's audio extractor (`feature_extractor`; Granite Speech's `audio_processor`)."""
    extractor = getattr(processor, "feature_extractor", None) or getattr(processor, "audio_processor", None)
    return getattr(extractor, "sampling_rate", SAMPLING_RATE)


def takes_audio(processor) -> bool:
    """Whether the processor's call takes clips beside a prompt (Voxtral's takes text only: its audio goes through its
    transcription request)."""
    return "audio" in inspect.signature(processor.__call__).parameters


def processor_inputs(processor, clips: list, prompt: str | None, model_id: str = "", **kwargs) -> dict:
    """The processor's inputs for `clips`, as users make them: its transcription request where it has one and can
    write it (a chat template, or a processor whose call takes no audio), else its audio placeholder before `prompt`
    (one per clip); `kwargs`: the processor's own; `model_id`: the checkpoint, where the request names it."""
    rate = sampling_rate(processor)
    request = getattr(processor, "apply_transcription_request", None)
    if prompt is None and request and (getattr(processor, "chat_template", None) or not takes_audio(processor)):
        params = inspect.signature(request).parameters
        named = {"model_id": model_id} if "model_id" in params else {}
        if "format" in params:  # Voxtral's encodes each clip in an audio container first
            named["format"] = "wav"
        if "language" in params and params["language"].default is inspect.Parameter.empty:
            named["language"] = [None] * len(clips)  # transformers 4's Voxtral asks; None: detected (5's default)
        return dict(request(audio=clips, sampling_rate=rate, **named, **kwargs))
    if not takes_audio(processor):
        raise ExportError(f"{type(processor).__name__} takes clips through its transcription request only: the export "
                          "cannot run it on a prompt of its own")
    token = getattr(processor, "audio_token", None)
    if token is None:
        raise ExportError(f"{type(processor).__name__} has no audio placeholder (audio_token) and no chat template: "
                          "cannot make the prompt of the export's run")
    text = [f"{token} {prompt or 'Transcribe the audio.'}"] * len(clips)
    if "padding" not in kwargs:  # prompts of two lengths padded; the audio as the processor pads it
        kwargs["text_kwargs"] = {"padding": True}
    return dict(processor(text=text, audio=clips, sampling_rate=rate, return_tensors="pt", **kwargs))


class AudioFeatures(torch.nn.Module):
    """The model's own `get_audio_features` on the processor's audio tensors: one row per audio token, the clips
    in order (transformers 5 returns them as the output's `pooler_output`); `masks`: the processor's masks of those
    rows, applied after it as the model applies them (Granite Speech's `input_features_mask`)."""

    def __init__(self, model: torch.nn.Module, masks: tuple[str, ...] = ()):
        super().__init__()
        self.model, self.masks = model, masks

    def forward(self, **audio):
        masks = [audio.pop(name) for name in self.masks]
        out = self.model.get_audio_features(**audio)
        if not isinstance(out, torch.Tensor):
            out = out.pooler_output
        for mask in masks:
            out = out[mask]
        return out.reshape(-1, out.shape[-1])


def features_params(model) -> dict:
    """The parameters of the model's `get_audio_features` (the inner model's: the top model's own may take
    (*args, **kwargs) and pass them on)."""
    inner = getattr(model, "model", None)
    return inspect.signature(getattr(inner, "get_audio_features", model.get_audio_features)).parameters


def audio_inputs(model, inputs: dict) -> dict[str, torch.Tensor]:
    """The processor's tensors `get_audio_features` takes (features and their mask, whatever their names), then its
    row masks (`row_masks`)."""
    params = features_params(model)
    taken = {k: v for k, v in inputs.items() if k in params and isinstance(v, torch.Tensor)}
    return {**taken, **{k: inputs[k] for k in row_masks(model, inputs)}}


def row_masks(model, inputs: dict) -> list[str]:
    """The processor's boolean (clip, row) tensors that the model's forward takes and `get_audio_features` does not:
    masks of the valid rows of its output, which the model applies before merging them (Granite Speech)."""
    params, forward = features_params(model), inspect.signature(model.forward).parameters
    return [k for k, v in inputs.items() if k not in params and k in forward and k.endswith("mask")
            and k != "attention_mask" and isinstance(v, torch.Tensor) and v.dtype == torch.bool and v.dim() == 2]


def observe_speech_lm(model, processor, clips=None, prompt: str | None = None, max_new_tokens: int = 4):
    """One greedy `generate` on two clips under observation: (plan, layout, that `Generation`), as `observe_vlm`."""
    token_id = audio_token_id(model.config)
    inner, embeddings = getattr(model, "model", None), model.get_input_embeddings()
    if not hasattr(model, "get_audio_features") or not isinstance(inner, torch.nn.Module):
        raise ExportError(f"{type(model).__name__} has no get_audio_features and inner model: the export takes speech "
                          "LLMs whose audio features replace audio-token rows of the input embeddings")
    language = [m for m in inner.children() if holds_embeddings(m, embeddings)]
    if len(language) != 1:
        raise ExportError(f"cannot tell the language model among {[n for n, _ in inner.named_children()]}")
    clips = clips or default_clips(sampling_rate(processor))
    inputs = processor_inputs(processor, clips, prompt, model.name_or_path)
    with observe(top=model, embed=embeddings, language=language[0]) as obs, torch.no_grad():
        tokens = model.generate(**inputs, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, do_sample=False)
    for observer in obs.values():
        logger.info("    %s", observer.summary())
    if not obs["language"].calls:
        raise ExportError("generate never ran the language model")

    decoder = TextDecoder(model)
    decoder_obs = InputObserver(decoder, "decoder", calls=decoder_calls(obs["top"].calls, obs["language"].calls, None))
    check_decoder(decoder, decoder_obs.calls[0], obs["language"].calls[0])
    plan = {
        "audio_features": (audio_observer(model, inputs, obs["language"].calls[0], token_id, processor), None, None),
        "embed_tokens": (obs["embed"], None, None),
        "decoder_model": (decoder_obs, DECODER_INPUTS[:4], {}),
    }
    layout = {
        "model_type": model.config.model_type,
        "components": {name: f"{name}/model.onnx" for name in plan},
        "audio_token_id": token_id,
        "audio_inputs": list(audio_inputs(model, inputs)),
        "vocab_size": model.config.get_text_config().vocab_size,
        # positions as the language model had them: from the mask (left padding), or counted from its cache
        "positions": "mask" if "position_ids" in obs["language"].calls[0].kwargs else "count",
    }
    given = {k: v for k, v in inputs.items() if k != "labels"}
    return plan, layout, Generation(given, greedy(max_new_tokens), tokens[:, inputs["input_ids"].shape[1] :])


def audio_observer(model, inputs: dict, language: Call, token_id: int, processor) -> InputObserver:
    """The audio graph's calls: the clips of the observed prompt -> the rows the model merged at its audio tokens
    (read from the language model's embeddings at the prefill, checked against the wrapper in PyTorch), and a
    second batch of one clip of another length, so the number of frames is dynamic."""
    given = audio_inputs(model, inputs)
    wrapper = taking(AudioFeatures, list(given))(model, tuple(row_masks(model, inputs)))
    calls = [Call(given, merged_rows(wrapper, given, language, inputs["input_ids"], token_id, "audio"))]
    # a clip padded to its own length, not the processor's window: where the tower takes it (GLM-ASR; Whisper-style
    # towers take their full window only), the number of frames is dynamic
    one = default_clips(seconds=(1.6,), seed=1)
    other = audio_inputs(model, processor_inputs(processor, one, "other" if takes_audio(processor) else None,
                                                 model.name_or_path, padding=True))
    if {k: tuple(v.shape) for k, v in other.items()} != {k: tuple(v.shape) for k, v in given.items()}:
        try:
            with torch.no_grad():
                calls.append(Call(other, wrapper(**other)))
        except (RuntimeError, ValueError) as e:  # PyTorch's own refusal of that length
            logger.info("    audio_features: frames fixed at %s (the tower refuses %s: %s)",
                        tuple(given[next(iter(given))].shape[2:]), tuple(other[next(iter(other))].shape[2:]),
                        str(e).splitlines()[0][:120])
    return InputObserver(wrapper, "audio_features", calls=calls)


def load_audio_processor(model_id: str, loading: dict):
    """The checkpoint's processor (tokenizer and feature extractor); refused in one line without one: the export
    runs the model on clips and a prompt, which only the processor can make."""
    from transformers import AutoProcessor

    try:
        processor = AutoProcessor.from_pretrained(model_id, **loading)
        if hasattr(processor, "feature_extractor") or hasattr(processor, "audio_processor"):
            return processor
        got = f"got a {type(processor).__name__} only"
    except Exception as e:
        got = type(e).__name__
    raise ExportError(f"cannot load the processor of {model_id} ({got}): speech LLM exports run the model on clips and "
                      "a prompt, which need the checkpoint's processor files (tokenizer and feature extractor)")


class SpeechLmOnnxExporter(VlmOnnxExporter):
    """The three components, observed in one `generate` on two clips, one directory each, beside the model's config,
    generation config, processor and `speech_lm.json` (one manifest on top)."""

    layout_file = LAYOUT_FILE

    def __init__(self, *, clips=None, prompt: str | None = None, max_new_tokens: int = 4):
        super().__init__(prompt=prompt, max_new_tokens=max_new_tokens)
        self.clips = clips

    def load(self, ctx: ExportContext) -> None:
        target = ctx.target
        ctx.model_id, ctx.config, ctx.task = target.model_id, target.config, target.task
        ctx.processor = load_audio_processor(ctx.model_id, ctx.options.loading)  # before the weights
        ctx.model = target.model.eval() if target.model is not None else load_weights(ctx)

    def components(self, ctx: ExportContext) -> list[Component]:
        self.parts, self.layout, generation = observe_speech_lm(ctx.model, ctx.processor, self.clips, self.prompt,
                                                                self.max_new_tokens)
        self.tokens, ctx.generations = generation.tokens, [generation]
        parts = super(VlmOnnxExporter, self).components(ctx)
        for part in parts:
            path = PurePosixPath(self.layout["components"][part.name])
            part.directory, part.stem = str(path.parent), path.stem
        return parts


__all__ = ["AudioFeatures", "LAYOUT_FILE", "SpeechLmOnnxExporter", "default_clips", "speech_lm",
           "observe_speech_lm", "processor_inputs"]
