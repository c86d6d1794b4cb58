"""Python API: export a module observed while running your own code (a pipeline, a custom loop).

    with observe(model) as obs:
        pipe("some text")
    result = export_observed(obs, "out_dir", atol=1e-4)
    result.discrepancies

Inputs default to every tensor or cache the module was called with, in forward order; constants to
every other named argument that had the same value in every call (e.g. `use_cache=True`).
"""

from __future__ import annotations

import inspect
import logging
from pathlib import Path
from typing import Any, Sequence

import torch

from ..capture import InputObserver
from ..errors import ExportError
from ..flatten import is_cache
from ..options import ExportOptions
from .base import ExportContext
from .component import Component
from .onnx import OnnxExporter

logger = logging.getLogger(__name__)


def default_inputs(observer: InputObserver) -> list[str]:
    names = {k for c in observer.calls for k, v in c.kwargs.items() if isinstance(v, torch.Tensor) or is_cache(v)}
    return [p for p in inspect.signature(observer.module.forward).parameters if p in names]


def default_constants(observer: InputObserver, inputs: Sequence[str]) -> dict[str, Any]:
    """Named forward parameters with the same plain value in every call (not those caught by **kwargs)."""
    params = inspect.signature(observer.module.forward).parameters
    constants = {}
    for key, value in observer.calls[0].kwargs.items():
        if key in inputs or key not in params or not isinstance(value, (bool, int, float, str)):
            continue
        if all(c.kwargs.get(key, object()) == value for c in observer.calls):
            constants[key] = value
    return constants


class ObservedOnnxExporter(OnnxExporter):
    """The ONNX exporter over modules the caller observed (no load: the modules are given; no capture: the
    calls are recorded). `parts`: component name -> (observer, inputs or None, constants or None)."""

    capture_error = ExportError  # the caller's observation cannot be exported: theirs to change

    def __init__(self, parts: dict[str, tuple[InputObserver, Sequence[str] | None, dict | None]], *, directories=False):
        self.parts, self.directories = parts, directories

    def load(self, ctx: ExportContext) -> None:
        pass

    def components(self, ctx: ExportContext) -> list[Component]:
        return [self.component(name, observer, inputs, constants, ctx.options, name if self.directories else "")
                for name, (observer, inputs, constants) in self.parts.items()]

    @staticmethod
    def component(name: str, observer: InputObserver, inputs, constants, options: ExportOptions,
                  directory: str = "") -> Component:
        inputs = list(inputs or default_inputs(observer))
        if "attention_mask" in inspect.signature(observer.module.forward).parameters and "attention_mask" not in inputs:
            logger.warning(
                "no observed call passed attention_mask (generate drops an all-ones mask): the graph will "
                "take none and cannot serve padded batches; observe a padded batch to keep it"
            )
        constants = default_constants(observer, inputs) if constants is None else dict(constants)
        forced = {k: getattr(options, k) for k in ("dynamic_batch", "dynamic_sequence") if getattr(options, k) is not None}
        return Component(name, observer, inputs, constants, directory=directory, **forced)

    def copy_files(self, ctx: ExportContext) -> None:
        config = getattr(ctx.model, "config", None)
        if hasattr(config, "save_pretrained"):
            config.save_pretrained(ctx.staging)


def export_observed(
    observer: InputObserver,
    output: str | Path,
    *,
    inputs: Sequence[str] | None = None,
    constants: dict[str, Any] | None = None,
    **options,
) -> ExportContext:
    """Export `observer.module` to `output/model.onnx` from its recorded calls, and check onnxruntime
    against the recorded outputs (`atol=` makes a larger difference an error)."""
    ctx = ExportContext(output=Path(output), options=ExportOptions.make(**options),
                        model_id=type(observer.module).__name__, model=observer.module, observer=observer)
    return ObservedOnnxExporter({"model": (observer, inputs, constants)}).run(ctx)
