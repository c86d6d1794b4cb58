"""The ONNX entry point: which exporter a model's task takes (one decoder graph, or encoder-decoder
components), from a hub id, a directory or an in-memory model."""

from __future__ import annotations

from pathlib import Path

from ..errors import ExportError
from .base import ExportContext
from .onnx import OnnxExporter
from .onnx_optimize import check_level
from .seq2seq import Seq2SeqContext, Seq2SeqOnnxExporter


def export_onnx(model, output, task: str | None = None, **options) -> ExportContext:
    """Export `model` (hub id, local dir, or an in-memory `PreTrainedModel`, captured as it is) to `output`
    with the dynamo path. `optimize_level="O1".."O3"`: optimum's `--optimize` levels (see `onnx_optimize`)."""
    check_level(options.get("optimize_level"))
    loaded = None if isinstance(model, (str, Path)) else model
    model_id = str(model) if loaded is None else (getattr(loaded, "name_or_path", "") or type(loaded).__name__)
    encoder_decoder = _is_encoder_decoder(model_id, task, options, loaded)
    if encoder_decoder and options.get("monolith"):
        from ..flags import FlagError

        raise FlagError("--monolith: encoder-decoder models are exported as encoder + decoder graphs with --dynamo "
                        "(optimum's runtime loads them so); drop --monolith or export without --dynamo")
    if encoder_decoder and (options.get("pt2") or options.get("aoti")):
        raise ExportError("--pt2/--aoti are not supported for encoder-decoder exports yet")
    if encoder_decoder and options.get("optimize_level"):
        raise ExportError("--optimize is not supported for encoder-decoder exports with --dynamo yet")
    if encoder_decoder:
        ctx = Seq2SeqContext(model_id=model_id, output=Path(output), task_name=task, options=options, model=loaded)
        return Seq2SeqOnnxExporter().run(ctx)
    ctx = ExportContext(model_id=model_id, output=Path(output), task_name=task, options=options, model=loaded)
    return OnnxExporter().run(ctx)


def _is_encoder_decoder(model_id, task: str | None, options: dict, loaded=None) -> bool:
    """Whether the task is exported as encoder + decoder graphs (errors are left to the load stage)."""
    from transformers import AutoConfig

    from ..tasks import resolve_task

    try:
        kwargs = {"trust_remote_code": options.get("trust_remote_code", False), **options.get("hub_options", {})}
        if loaded is not None:
            return resolve_task(task, loaded, loaded.config).spec.encoder_decoder
        config = None if task not in (None, "auto") else AutoConfig.from_pretrained(str(model_id), **kwargs)
        return resolve_task(task, str(model_id), config).spec.encoder_decoder
    except Exception:
        return False


__all__ = ["export_onnx"]
