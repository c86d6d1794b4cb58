"""Encoder-decoder models (seq2seq, speech, vision): several ONNX graphs in optimum's layout.

The shared stages run once per component; a component is one graph and the calls recorded for it
during the capture (real `generate` runs plus a scoring forward):

    encoder_model.onnx            the encoder's calls
    decoder_model.onnx            decoder steps without a cache (first step, scoring), decoder + LM head
    decoder_with_past_model.onnx  decoder steps on a filled cache (any past length, any new tokens)

Names are optimum's (`encoder_hidden_states`, `past_key_values.N.decoder.key`, `present.N.encoder.key`...),
so `ORTModelForSeq2SeqLM` / `ORTModelForSpeechSeq2Seq` / `ORTModelForVision2Seq` load the directory unchanged.
"""

from __future__ import annotations

import logging
import fnmatch
import inspect
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers.modeling_outputs import BaseModelOutput

from .. import patches
from ..capture import Call, CaptureError, infer_arguments, observe
from ..errors import PipelineError
from ..flatten import flat_inputs, flat_outputs
from ..manifest import MANIFEST_FILE, versions
from ..validate import as_dicts
from .base import ExportContext, preprocessor, forward_adapter
from .onnx import OnnxExporter, optimize_graph, rename_io, save_graph, translate_program, validate_graph

logger = logging.getLogger(__name__)

ENCODER_INPUTS = ("input_ids", "attention_mask", "input_features", "pixel_values", "input_values")
DECODER_INPUTS = ("input_ids", "encoder_hidden_states", "encoder_attention_mask", "past_key_values")


class DecoderWithHead(torch.nn.Module):
    """The decoder side as optimum's runtime runs it: decoder + LM head, from the encoder's hidden states."""

    def __init__(self, model: torch.nn.Module, use_cache: bool):
        super().__init__()
        self.model, self.use_cache = model, use_cache
        self._takes_mask = "attention_mask" in inspect.signature(model.forward).parameters

    def forward(self, input_ids, encoder_hidden_states, encoder_attention_mask=None, past_key_values=None):
        extra = {"attention_mask": encoder_attention_mask} if self._takes_mask and encoder_attention_mask is not None else {}
        out = self.model(
            decoder_input_ids=input_ids,
            encoder_outputs=BaseModelOutput(last_hidden_state=encoder_hidden_states),
            past_key_values=past_key_values,
            use_cache=self.use_cache,
            return_dict=True,
            **extra,
        )
        return {"logits": out.logits, "past_key_values": out.past_key_values} if self.use_cache else {"logits": out.logits}


@dataclass
class Component:
    name: str  # file stem, optimum's name
    module: torch.nn.Module
    calls: list[Call]
    inputs: tuple[str, ...]
    labels: dict[str, str] = field(default_factory=dict)  # inferred axis name -> optimum's name here
    keep: str = "*"  # outputs written (fnmatch patterns, comma-separated); others are dropped
    drop_unused: tuple[str, ...] = ()  # inputs removed when the optimized graph does not read them
    arguments: Any = None
    program: Any = None
    onnx_program: Any = None
    output_names: list[str] = field(default_factory=list)
    inputs_kept: list[str] = field(default_factory=list)  # the saved graph's inputs
    discrepancies: list[Any] = field(default_factory=list)

    @property
    def files(self) -> list[str]:
        return [f"{self.name}.onnx", f"{self.name}.onnx_data"]


@dataclass
class Seq2SeqContext(ExportContext):
    processor: Any = None  # feature extractor or image processor
    components: list[Component] = field(default_factory=list)


def _has_past(kwargs: dict) -> bool:
    return bool(flat_inputs(kwargs, ["past_key_values"]))


def decoder_call(call: Call, use_cache: bool) -> Call:
    """A call of the whole model, seen from the decoder: optimum's decoder inputs and outputs."""
    kw = call.kwargs
    encoder = kw.get("encoder_outputs")
    hidden = encoder[0] if encoder is not None else call.outputs.encoder_last_hidden_state
    inputs = {"input_ids": kw["decoder_input_ids"], "encoder_hidden_states": hidden}
    if kw.get("attention_mask") is not None:
        inputs["encoder_attention_mask"] = kw["attention_mask"]
    if use_cache and _has_past(kw):
        inputs["past_key_values"] = kw["past_key_values"]
    outputs = {"logits": call.outputs.logits}
    if use_cache:
        outputs["past_key_values"] = call.outputs.past_key_values
    return Call(inputs, outputs)


def components(model, encoder_calls: list[Call], model_calls: list[Call], with_past: bool) -> list[Component]:
    decoder_calls = [decoder_call(c, with_past) for c in model_calls if c.kwargs.get("decoder_input_ids") is not None]
    encoder_inputs = tuple(p for p in inspect.signature(model.get_encoder().forward).parameters if p in ENCODER_INPUTS)
    decoder_labels = {"sequence_length": "decoder_sequence_length"}
    parts = [
        Component("encoder_model", model.get_encoder(), encoder_calls, encoder_inputs,
                  {"sequence_length": "encoder_sequence_length"}, keep="last_hidden_state",
                  drop_unused=("attention_mask",)),  # Whisper's generate passes one its encoder never reads
        Component("decoder_model", DecoderWithHead(model, with_past),
                  [c for c in decoder_calls if "past_key_values" not in c.kwargs], DECODER_INPUTS, decoder_labels,
                  drop_unused=("encoder_attention_mask",)),
    ]
    if with_past:
        # optimum's with-past decoder returns the self-attention cache only (the cross cache is an input)
        parts.append(Component("decoder_with_past_model", DecoderWithHead(model, True),
                               [c for c in decoder_calls if "past_key_values" in c.kwargs], DECODER_INPUTS,
                               decoder_labels, keep="logits,present.*.decoder.*",
                               drop_unused=("encoder_hidden_states", "encoder_attention_mask")))
    return parts


def _kept(name: str, keep: str) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in keep.split(","))


class Seq2SeqOnnxExporter(OnnxExporter):
    """The ONNX exporter's stages (same names, same order), each run for every component."""

    def load(self, ctx: Seq2SeqContext) -> None:
        loaded = ctx.model is not None
        super().load(ctx)
        ctx.processor = None if loaded else _processor(ctx.model_id, ctx.options)

    def capture(self, ctx: Seq2SeqContext) -> None:
        model = ctx.model
        adapter = forward_adapter(model, ctx.options.get("model_kwargs"), model.get_encoder())
        with adapter, observe(encoder=model.get_encoder(), model=model) as obs:
            ctx.task.spec.driver(model, ctx.tokenizer, ctx.processor)
        ctx.observer = obs["model"]
        ctx.components = components(model, obs["encoder"].calls, obs["model"].calls, ctx.task.with_past)
        for part in ctx.components:
            logger.info("    %s: %d calls recorded", part.name, len(part.calls))

    def infer(self, ctx: Seq2SeqContext) -> None:
        for part in ctx.components:
            try:
                args = infer_arguments(part.calls, part.inputs, dynamic_sequence=True)
            except CaptureError as e:
                raise PipelineError(f"{part.name}: {e}") from e
            args.axis_names = {n: {a: part.labels.get(label, label) for a, label in axes.items()}
                               for n, axes in args.axis_names.items()}
            part.arguments = args

    def export_program(self, ctx: Seq2SeqContext) -> None:
        for part in ctx.components:
            args = part.arguments
            # no empty cache here (the first step has its own graph): no need for size-oblivious tracing,
            # which makes T5's attention reshape fail to decompose on transformers 5
            with patches.applied(), torch.no_grad():
                part.program = torch.export.export(
                    part.module, (), kwargs=args.kwargs, dynamic_shapes=args.dynamic_shapes, strict=False
                )

    def translate(self, ctx: Seq2SeqContext) -> None:
        for part in ctx.components:
            part.onnx_program = translate_program(part.program, ctx.options)
            part.program = None

    def name_io(self, ctx: Seq2SeqContext) -> None:
        for part in ctx.components:
            sample = part.calls[part.arguments.sample_call]
            names = list(flat_outputs(sample.outputs))
            graph = part.onnx_program.model.graph
            if len(graph.outputs) != len(names):
                raise PipelineError(f"{part.name}: graph has {len(graph.outputs)} outputs, expected {len(names)}")
            # drop before naming: a dropped output may be an input passed through (the cross cache)
            kept = [(value, name) for value, name in zip(graph.outputs, names) if _kept(name, part.keep)]
            graph.outputs.clear()
            graph.outputs.extend(value for value, _ in kept)
            part.output_names = [name for _, name in kept]
            rename_io(part.onnx_program.model, part.arguments.input_names, part.arguments.axis_names, part.output_names)

    def optimize(self, ctx: Seq2SeqContext) -> None:
        for part in ctx.components:
            optimize_graph(part.onnx_program.model, ctx.options)
            graph = part.onnx_program.model.graph  # e.g. the encoder's states once the cross cache is given
            unused = [v for v in graph.inputs if v.name in part.drop_unused and not v.uses()]
            for value in unused:
                graph.inputs.remove(value)

    def save(self, ctx: Seq2SeqContext) -> None:
        for part in ctx.components:
            part.inputs_kept = [v.name for v in part.onnx_program.model.graph.inputs]
            save_graph(part.onnx_program.model, ctx.staging, part.files, ctx.options)
            part.onnx_program = None  # memory: one graph's weights at a time

    def validate(self, ctx: Seq2SeqContext) -> None:
        if ctx.options.get("validate") is False:  # do_validation=False
            logger.info("    skipped (do_validation=False)")
            return
        for part in ctx.components:
            part.discrepancies = validate_graph(ctx.staging / part.files[0], part.calls, part.arguments,
                                                part.output_names, part.module, ctx.options, part.name, GraphInputs)

    def manifest(self, ctx: Seq2SeqContext) -> None:
        parts = {
            part.name: {
                "files": part.files,
                "inputs": part.inputs_kept,
                "outputs": part.output_names,
                "dynamic_axes": {n: {str(a): label for a, label in axes.items()}
                                 for n, axes in part.arguments.axis_names.items()},
                "static_axes": static_axes(ctx.model, part),
                "calls_recorded": len(part.calls),
                "sample_call": part.arguments.sample_call,
                "discrepancies": as_dicts(part.discrepancies),
            }
            for part in ctx.components
        }
        data = {
            "exporter": "dynamo",
            "model": ctx.model_id,
            "task": ctx.task.name,
            "dtype": ctx.options.get("dtype") or "fp32",
            "versions": versions(),
            "files": [f for part in ctx.components for f in part.files],
            "components": parts,
            "discrepancies": [dict(row, component=name) for name, part in parts.items() for row in part["discrepancies"]],
            "timings_s": ctx.timings,
        }
        (ctx.staging / MANIFEST_FILE).write_text(json.dumps(data, indent=2) + "\n")


def static_axes(model, part: Component) -> dict[str, dict[str, str]]:
    """Axes of encoder features that stay static, with the reason (Whisper takes a fixed number of frames)."""
    frames = getattr(model.config, "max_source_positions", None)
    found = {}
    for name in part.arguments.input_names:
        if name == "input_features" and frames is not None:
            shape = part.arguments.shapes[name][0]
            axis = len(shape) - 1
            if axis not in part.arguments.axis_names.get(name, {}):
                found[name] = {str(axis): f"{model.config.model_type}'s encoder takes exactly {shape[axis]} frames "
                               f"(2 x max_source_positions = {2 * frames}); pad or cut features to that length"}
    return found


class GraphInputs:
    """A session fed only the inputs its graph kept (see `Component.drop_unused`)."""

    def __init__(self, session):
        self.session, self._names = session, {i.name for i in session.get_inputs()}

    def get_outputs(self):
        return self.session.get_outputs()

    def run(self, outputs, feed):
        return self.session.run(outputs, {k: v for k, v in feed.items() if k in self._names})


def _processor(model_id: str, options: dict):
    """The checkpoint's image processor or feature extractor (None for text models)."""
    kwargs = {"trust_remote_code": options.get("trust_remote_code", False), **options.get("hub_options", {})}
    return preprocessor(model_id, kwargs, ("AutoImageProcessor", "AutoFeatureExtractor"))


def export_seq2seq(model_id: str, output, task: str | None = None, **options) -> Seq2SeqContext:
    ctx = Seq2SeqContext(model_id=str(model_id), output=Path(output), task_name=task, options=options)
    return Seq2SeqOnnxExporter().run(ctx)


__all__ = ["Component", "DecoderWithHead", "Seq2SeqOnnxExporter", "components", "decoder_call", "export_seq2seq"]
