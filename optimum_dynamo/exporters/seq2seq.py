"""Encoder-decoder models (seq2seq, speech, vision): several ONNX graphs in optimum's layout.

The shared stages run once per component; a component is one graph and the calls recorded for it
during the capture (real `generate` runs plus a scoring forward):

    encoder_model.onnx            the encoder's calls
    decoder_model.onnx            decoder steps without a cache (first step, scoring), decoder + LM head
    decoder_with_past_model.onnx  decoder steps on a filled cache (any past length, any new tokens)
    text_encoder_model.onnx       image-text-to-text: the encoder's calls on prompts without an image, if any

Names are optimum's (`encoder_hidden_states`, `past_key_values.N.decoder.key`, `present.N.encoder.key`...),
so `ORTModelForSeq2SeqLM` / `ORTModelForSpeechSeq2Seq` / `ORTModelForVision2Seq` load the directory unchanged.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging

import torch
from transformers.modeling_outputs import BaseModelOutput, ModelOutput

from legacy_bridge import cache_argument

from ..capture import Call, InputObserver, observe
from ..errors import PipelineError
from ..flatten import clone_cache, flat_inputs, is_cache
from .base import ExportContext, forward_adapter, preprocessor
from .component import Component
from .onnx import OnnxExporter

logger = logging.getLogger(__name__)

ENCODER_INPUTS = ("input_ids", "attention_mask", "input_features", "pixel_values", "input_values")
DECODER_INPUTS = ("input_ids", "encoder_hidden_states", "encoder_attention_mask", "past_key_values")
TEXT_ENCODER = "text_encoder_model"  # the encoder on prompts without an image, where the model takes them


class DecoderWithHead(torch.nn.Module):
    """The decoder side as optimum's runtime runs it: decoder + LM head, from the encoder's hidden states."""

    def __init__(self, model: torch.nn.Module, use_cache: bool, encoder_output: type = BaseModelOutput, empty=None):
        super().__init__()
        self.model, self.use_cache, self.encoder_output = model, use_cache, encoder_output
        self.empty = empty  # the empty cache generate starts from, where the model's own would differ
        self._takes_mask = "attention_mask" in inspect.signature(model.forward).parameters
        self._output_fields = {f.name for f in dataclasses.fields(encoder_output)} if dataclasses.is_dataclass(
            encoder_output) else set()

    def forward(self, input_ids, encoder_hidden_states, encoder_attention_mask=None, past_key_values=None):
        extra = {"attention_mask": encoder_attention_mask} if self._takes_mask and encoder_attention_mask is not None else {}
        if past_key_values is None and self.use_cache and self.empty is not None:
            past_key_values = clone_cache(self.empty)
        # an encoder output that carries the mask (transformers 5's Moonshine) hands it to the decoder
        carried = {"attention_mask": encoder_attention_mask} if "attention_mask" in self._output_fields else {}
        out = self.model(
            decoder_input_ids=input_ids,
            encoder_outputs=self.encoder_output(last_hidden_state=encoder_hidden_states, **carried),
            **{cache_argument.name(): past_key_values},
            use_cache=self.use_cache,
            return_dict=True,
            **extra,
        )
        return {"logits": out.logits, "past_key_values": cache_argument.of(out)} if self.use_cache else {"logits": out.logits}


def _has_past(kwargs: dict) -> bool:
    return bool(flat_inputs({"past_key_values": cache_argument.of(kwargs)}, ["past_key_values"]))


def decoder_call(call: Call, use_cache: bool) -> Call:
    """A call of the whole model, seen from the decoder: optimum's decoder inputs and outputs."""
    kw = call.kwargs
    encoder = kw.get("encoder_outputs")
    hidden = encoder[0] if encoder is not None else call.outputs.encoder_last_hidden_state
    inputs = {"input_ids": kw["decoder_input_ids"], "encoder_hidden_states": hidden}
    if kw.get("attention_mask") is not None:
        inputs["encoder_attention_mask"] = kw["attention_mask"]
    if use_cache and _has_past(kw):
        inputs["past_key_values"] = cache_argument.of(kw)
    outputs = {"logits": call.outputs.logits}
    if use_cache:
        outputs["past_key_values"] = cache_argument.of(call.outputs)
    return Call(inputs, outputs)


def empty_cache(calls: list[Call]):
    """The empty cache generate's first step got, if the model left alone makes a cache of another class
    (transformers 4.55's VisionEncoderDecoder: a DynamicCache without the cross-attention part), else None."""
    first = [c for c in calls if is_cache(cache_argument.of(c.kwargs)) and not _has_past(c.kwargs)]
    alone = {type(cache_argument.of(c.outputs)) for c in calls if cache_argument.of(c.kwargs) is None}
    empty = cache_argument.of(first[0].kwargs) if first else None
    return empty if empty is not None and alone - {type(empty), type(None)} else None


def components(model, encoder_calls: list[Call], model_calls: list[Call], with_past: bool) -> list[Component]:
    decoder_calls = [decoder_call(c, with_past) for c in model_calls if c.kwargs.get("decoder_input_ids") is not None]
    empty = empty_cache(model_calls) if with_past else None
    encoder_inputs = tuple(p for p in inspect.signature(model.get_encoder().forward).parameters if p in ENCODER_INPUTS)
    # no empty cache here (the first step has its own graph): no need for size-oblivious tracing, which makes
    # T5's attention reshape fail to decompose on transformers 5
    common = dict(dynamic_sequence=True, size_oblivious=False)
    decoder_labels = {"sequence_length": "decoder_sequence_length"}
    # the encoder's own output class (transformers 5's nllb-moe reads `router_logits` from it)
    encoded = encoder_calls[0].outputs if encoder_calls else None
    output_class = type(encoded) if isinstance(encoded, ModelOutput) else BaseModelOutput

    def observed(name, module, calls):
        return InputObserver(module, name, calls=calls)

    # prompts without an image (an image-text-to-text model's) get an encoder graph of their own
    with_image = [c for c in encoder_calls if c.kwargs.get("pixel_values") is not None]
    text_calls = [c for c in encoder_calls if c.kwargs.get("pixel_values") is None] if with_image else []
    parts = [
        Component("encoder_model", observed("encoder_model", model.get_encoder(), with_image or encoder_calls),
                  encoder_inputs,
                  labels={"sequence_length": "encoder_sequence_length"}, keep="last_hidden_state",
                  drop_unused=("attention_mask",), **common),  # Whisper's generate passes one its encoder never reads
        Component("decoder_model", observed("decoder_model", DecoderWithHead(model, with_past, output_class, empty),
                                            [c for c in decoder_calls if "past_key_values" not in c.kwargs]),
                  DECODER_INPUTS, labels=decoder_labels, drop_unused=("encoder_attention_mask",), **common),
    ]
    if text_calls:
        parts.append(Component(TEXT_ENCODER, observed(TEXT_ENCODER, model.get_encoder(), text_calls),
                               tuple(n for n in encoder_inputs if n != "pixel_values"),
                               labels={"sequence_length": "encoder_sequence_length"}, keep="last_hidden_state", **common))
    if with_past:
        # optimum's with-past decoder returns the self-attention cache only (the cross cache is an input)
        parts.append(Component("decoder_with_past_model",
                               observed("decoder_with_past_model", DecoderWithHead(model, True, output_class),
                                        [c for c in decoder_calls if "past_key_values" in c.kwargs]),
                               DECODER_INPUTS, labels=decoder_labels, keep="logits,present.*.decoder.*",
                               drop_unused=("encoder_hidden_states", "encoder_attention_mask"), **common))
    return parts


class Seq2SeqOnnxExporter(OnnxExporter):
    """The ONNX exporter over three components: the encoder, the decoder and the decoder with past."""

    def load(self, ctx: ExportContext) -> None:
        super().load(ctx)
        ctx.processor = None if ctx.target.model is not None else _processor(ctx.model_id, ctx.options.loading)

    def components(self, ctx: ExportContext) -> list[Component]:
        model = ctx.model
        if not getattr(model.config, "is_encoder_decoder", False) or not hasattr(model, "get_encoder"):
            # transformers 5 maps audio-text decoders (qwen2_audio, voxtral, ...) as seq2seq LMs too
            raise PipelineError(f"{model.config.model_type} is not an encoder-decoder model (its config says "
                                f"is_encoder_decoder=False): --task {ctx.task.name} exports an encoder and a decoder")
        adapter = forward_adapter(model, ctx.options.model_kwargs, model.get_encoder())
        with adapter, observe(encoder=model.get_encoder(), model=model) as obs:
            self.drive(ctx)
        ctx.observer = obs["model"]
        parts = components(model, obs["encoder"].calls, obs["model"].calls, self.with_past(ctx))
        for part in parts:
            logger.info("    %s: %d calls recorded", part.name, len(part.calls))
        return parts

    def with_past(self, ctx: ExportContext) -> bool:
        """Whether the decoder is exported with a cache (a decoder with past graph)."""
        return ctx.task.with_past

    def drive(self, ctx: ExportContext) -> None:
        """Run the model as users do (the task's driver), under observation."""
        ctx.task.spec.driver(ctx.model, ctx.tokenizer, ctx.processor)


def _processor(model_id: str, loading: dict):
    """The checkpoint's image processor or feature extractor (None for text models)."""
    return preprocessor(model_id, loading, ("AutoImageProcessor", "AutoFeatureExtractor"))


__all__ = ["TEXT_ENCODER", "DecoderWithHead", "Seq2SeqOnnxExporter", "components", "decoder_call"]
