"""The ONNX entry point: options made once, the model and its task resolved once, then the exporter its task
takes (one graph, or encoder-decoder components)."""

from __future__ import annotations

from pathlib import Path

from ..errors import ExportError
from ..options import FUSED_LEVELS, ExportOptions, check_level
from ..target import Target, resolve
from ..tasks import ENCODER_DECODER_TASKS, VISION_LANGUAGE_TASKS
from .base import ExportContext
from .onnx import OnnxExporter
from .seq2seq import Seq2SeqOnnxExporter
from .speech_language import SpeechLmOnnxExporter
from .vision_language import VlmOnnxExporter
from .vision_language.seq2seq import Seq2SeqVlmOnnxExporter


def export_onnx(model, output, task: str | None = None, *, options: ExportOptions | None = None,
                **values) -> ExportContext:
    """Export `model` (hub id, local dir, or an in-memory `PreTrainedModel`, captured as it is) to `output`
    with the dynamo path. Options as keywords (see `ExportOptions`: `atol`, `opset`, `optimize_level="O1".."O3"`,
    `dtype`, `pt2`, ...) or made beforehand (`options=`)."""
    if options is None:
        options = ExportOptions.make(task=task, **values)
    elif task is not None or values:
        raise ExportError("pass the task and options in `options`, or as keywords, not both")
    check_level(options.optimize_level)
    return export_target(resolve(model, options), output, options)


def export_target(target: Target, output, options: ExportOptions, attempt: dict | None = None) -> ExportContext:
    """Export a resolved `target` (see `target.resolve`): the CLI resolves once and falls back with the same
    (`attempt["context"]`: the export's context, also when it fails, for the fallback's check)."""
    task = target.task_name.removesuffix("-with-past")
    vision_language = task in VISION_LANGUAGE_TASKS
    encoder_decoder = (task in ENCODER_DECODER_TASKS and target.task.spec.encoder_decoder) or (
        vision_language and getattr(target.config, "is_encoder_decoder", False))  # T5Gemma 2
    if encoder_decoder and options.monolith:
        from ..flags import FlagError

        raise FlagError("--monolith: encoder-decoder models are exported as encoder + decoder graphs with --dynamo "
                        "(optimum's runtime loads them so); drop --monolith or export without --dynamo")
    if encoder_decoder and (options.pt2 or options.aoti):
        raise ExportError("--pt2/--aoti are not supported for encoder-decoder exports yet")
    if encoder_decoder and options.quantize:
        raise ExportError("--quantize is not supported for encoder-decoder exports with --dynamo yet; quantize the "
                          "export with optimum-cli onnxruntime quantize, or drop --quantize")
    if encoder_decoder and options.optimize_level:
        raise ExportError("--optimize is not supported for encoder-decoder exports with --dynamo yet")
    if vision_language:
        check_vision_language(target.task_name, options)
        exporter = Seq2SeqVlmOnnxExporter() if encoder_decoder else VlmOnnxExporter()
    elif target.task.spec.speech_language:  # a speech LLM: components, as vision-language models
        check_vision_language(target.task_name, options)
        exporter = SpeechLmOnnxExporter()
    else:
        exporter = Seq2SeqOnnxExporter() if encoder_decoder else OnnxExporter()
    ctx = ExportContext(output=Path(output), options=options, target=target)
    if attempt is not None:
        attempt["context"] = ctx
    return exporter.run(ctx)


def check_vision_language(task: str, options: ExportOptions) -> None:
    """The options a component export (vision-language models, speech LLMs: graphs per component, fp32) cannot
    honour yet: one line each."""
    from ..flags import FlagError

    refused = [("--monolith", options.monolith, "the model is exported as component graphs (the image or audio "
                "features, embeddings, decoder); drop --monolith"),
               ("--pt2" if options.pt2 else "--aoti", options.pt2 or options.aoti,
                "not supported for component exports yet; drop it"),
               (f"--quantize {options.quantize}", options.quantize, "not supported for component exports yet; drop "
                "it (optimum-cli onnxruntime quantize quantizes a graph afterwards)"),
               (f"--optimize {options.optimize_level}", options.optimize_level in FUSED_LEVELS, "its fusions are "
                "for text decoders; use O1 or O2"),
               (f"--dtype {options.dtype}", options.dtype != "fp32", "the components are exported in fp32 only yet; "
                "drop --dtype"),
               ("--model-kwargs", options.model_kwargs, "not supported for component exports yet; drop it")]
    for spelling, given, why in refused:
        if given:
            raise FlagError(f"{spelling} with --task {task}: {why}")


__all__ = ["check_vision_language", "export_onnx", "export_target"]
