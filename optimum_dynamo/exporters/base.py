"""Staged exporters. A stage is a method decorated with `@stage("label")`; stages run in the order
they are defined, base class first. The stages shared by every backend live here:

    load -> capture -> infer arguments -> torch.export

Backends (ONNX, .pt2, ExecuTorch) add their own stages after these. Files are written to a
staging directory (`staging.staged`) and moved in place only when every stage has passed.
"""

from __future__ import annotations

import inspect
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .. import flatten, patches
from ..capture import CaptureError, InputObserver, infer_arguments
from ..errors import ExportError
from ..patches.transformers_sliding import seen_tokens_hook
from ..staging import staged
from ..tasks import Task, resolve_task

logger = logging.getLogger("optimum_dynamo")


def stage(label: str):
    def decorator(fn):
        fn._stage_label = label
        return fn

    return decorator


@dataclass
class ExportContext:
    model_id: str
    output: Path
    task_name: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    task: Task | None = None
    config: Any = None
    model: Any = None
    tokenizer: Any = None
    observer: InputObserver | None = None
    arguments: Any = None
    program: torch.export.ExportedProgram | None = None
    onnx_program: Any = None  # torch.onnx.ONNXProgram (ONNX backend)
    output_names: list[str] = field(default_factory=list)
    discrepancies: list[Any] = field(default_factory=list)
    staging: Path | None = None
    manifest: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)


class Exporter:
    backend = "base"

    @classmethod
    def stages(cls) -> list[tuple[str, str]]:
        """(label, method name) in run order."""
        found: list[tuple[str, str]] = []
        for klass in reversed(cls.__mro__):
            for name, fn in vars(klass).items():
                if hasattr(fn, "_stage_label") and all(n != name for _, n in found):
                    found.append((fn._stage_label, name))
        return found

    def run(self, ctx: ExportContext) -> ExportContext:
        with staged(ctx.output) as ctx.staging, flatten.registered():  # export and validation walk cache pytrees
            self._run_stages(ctx, self.stages())
        return ctx

    def _run_stages(self, ctx: ExportContext, stages) -> None:
        for i, (label, name) in enumerate(stages, 1):
            start = time.perf_counter()
            logger.info("[%d/%d] %s", i, len(stages), label)
            getattr(self, name)(ctx)
            ctx.timings[label] = round(time.perf_counter() - start, 3)

    # ── Stage: load ──
    @stage("load model")
    def load(self, ctx: ExportContext) -> None:
        from transformers import AutoConfig

        path = Path(ctx.model_id)
        if not path.is_dir() and (path.is_absolute() or ctx.model_id.startswith(".") or path.exists()):
            raise ExportError(f"model directory not found: {ctx.model_id}")
        kwargs = {"trust_remote_code": ctx.options.get("trust_remote_code", False), **ctx.options.get("hub_options", {})}
        try:
            ctx.config = AutoConfig.from_pretrained(ctx.model_id, **kwargs)
        except (OSError, ValueError) as e:
            raise ExportError(f"cannot load {ctx.model_id}: {str(e).splitlines()[0]}") from e
        ctx.task = resolve_task(ctx.task_name, ctx.model_id, ctx.config)
        auto_class = _tasks_auto_class(ctx.task.base)
        ctx.model = _load_model(auto_class, ctx.model_id, ctx.config, kwargs)
        ctx.tokenizer = _preprocessor(ctx.model_id, kwargs)

    # ── Stage: capture ──
    @stage("capture generation")
    def capture(self, ctx: ExportContext) -> None:
        with InputObserver(ctx.model, "model") as obs:
            ctx.task.spec.driver(ctx.model, ctx.tokenizer)
        ctx.observer = obs
        logger.info("    %s", obs.summary())

    # ── Stage: infer ──
    @stage("infer inputs and dynamic shapes")
    def infer(self, ctx: ExportContext) -> None:
        forward = inspect.signature(ctx.model.forward).parameters
        inputs = ctx.task.model_inputs(ctx.model)
        constants = ctx.task.spec.constants if ctx.task.with_past else {"use_cache": False}
        constants = {k: v for k, v in constants.items() if k in forward}
        try:
            ctx.arguments = infer_arguments(ctx.observer.calls, inputs, constants)
        except CaptureError as e:
            raise ExportError(str(e)) from e

    # ── Stage: torch.export ──
    @stage("torch.export")
    def export_program(self, ctx: ExportContext) -> None:
        args = ctx.arguments
        _plain_buffers(ctx.model)
        with patches.applied(options=_patch_options(ctx.options)), torch.no_grad(), seen_tokens_hook(ctx.model):
            with torch.fx.experimental._config.patch(backed_size_oblivious=True):
                ctx.program = torch.export.export(
                    ctx.model, (), kwargs=args.kwargs, dynamic_shapes=args.dynamic_shapes, strict=False
                )


def _patch_options(options: dict) -> tuple[str, ...]:
    """Optional patches an export asks for: fused levels keep grouped key/value heads unrepeated."""
    from ..patches.transformers_gqa import FUSED_ATTENTION

    return (FUSED_ATTENTION,) if options.get("optimize_level") in ("O3", "O4") else ()


def _plain_buffers(model) -> None:
    """Buffers registered as `nn.Parameter` (falcon_mamba on transformers 4) are seen twice by
    torch.export's unlifting ("attribute already exists"): keep their values as plain tensors."""
    for module in model.modules():
        for name, buffer in module._buffers.items():
            if isinstance(buffer, torch.nn.Parameter):
                module._buffers[name] = buffer.data


def _load_model(auto_class, model_id: str, config, kwargs: dict):
    """transformers >= 5 runs MoE experts as grouped matmuls by default, a custom op ONNX cannot translate:
    ask for batched matmuls (models without experts refuse the option and load as they are)."""
    from transformers import PreTrainedModel

    if hasattr(PreTrainedModel, "_check_and_adjust_experts_implementation"):
        try:
            return auto_class.from_pretrained(model_id, config=config, experts_implementation="batched_mm", **kwargs).eval()
        except (ValueError, TypeError):
            pass
    return auto_class.from_pretrained(model_id, config=config, **kwargs).eval()


def _preprocessor(model_id: str, kwargs: dict, autos: tuple[str, ...] = ("AutoTokenizer", "AutoImageProcessor")):
    """The checkpoint's first preprocessor among `autos` (transformers auto class names), else None
    (samples are then synthesized)."""
    import transformers

    for auto in (getattr(transformers, name) for name in autos):
        try:
            return auto.from_pretrained(model_id, **kwargs)
        except Exception:
            continue
    return None


def _tasks_auto_class(base_task: str):
    from optimum.exporters.tasks import TasksManager

    from legacy_bridge import transformers5

    transformers5.reapply()  # names optimum looks up on transformers (e.g. AutoModelForVision2Seq on 5.x)
    return TasksManager.get_model_class_for_task(base_task, library="transformers")
