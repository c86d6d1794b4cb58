"""optimum's Python entry points under `dynamo=True`: `main_export` / `onnx_export_from_model`, and
`ORTModel*.from_pretrained(export=True, dynamo=True)` (the CLI's are in `cli/`).

Both wrap optimum objects at run time (never editing optimum's files) and are idempotent.
"""

from __future__ import annotations

import functools
import inspect
from pathlib import Path
from tempfile import TemporaryDirectory

from . import quiet
from .migration import torchscript_chosen, use_dynamo
from .options import HUB_OPTIONS


def export_from_python(function, model, values: dict) -> None:
    """`main_export(..., dynamo=True)` / `onnx_export_from_model(model, ..., dynamo=True)`: the keyword
    arguments go through the same flag table; `model` is a hub id, a directory, or an in-memory model."""
    from . import flags
    from .exporters import export_onnx
    from .options import ExportOptions

    logger = quiet.logger()
    shapes = values.pop("kwargs_shapes", None) or {}
    values, defaults = flags.python_values(function, {**values, **shapes})
    values.pop("model", None)
    output = values.pop("output")
    options, notices = flags.resolve(values, defaults)
    for notice in notices:
        logger.warning("%s: %s", function.__name__, notice)
    export_onnx(model, output, options=ExportOptions.make(**options))


def _wrap_python_export(module, name: str, model_parameter: str) -> None:
    """`module.name(..., dynamo=True)` exports with optimum-dynamo; without it, optimum's function runs unchanged."""
    original = getattr(module, name)
    if getattr(original, "_optimum_dynamo", False):
        return

    @functools.wraps(original)
    def wrapper(*args, dynamo: bool | None = None, **kwargs):
        if not use_dynamo(dynamo):
            with torchscript_chosen():
                return original(*args, **kwargs)
        import inspect

        values = dict(inspect.signature(original).bind(*args, **kwargs).arguments)
        return export_from_python(original, values.pop(model_parameter), values)

    wrapper._optimum_dynamo = True
    setattr(module, name, wrapper)


def _wrap_export(cls) -> None:
    """`cls._export(..., dynamo=True)` exports with optimum-dynamo; otherwise unchanged."""
    original = cls.__dict__["_export"].__func__

    @functools.wraps(original)
    def _export(klass, model_id, config, *args, dynamo: bool | None = None, **kwargs):
        if not use_dynamo(dynamo):
            with torchscript_chosen():
                return original(klass, model_id, config, *args, **kwargs)
        return export_for_runtime(klass, model_id, config, **kwargs)

    cls._export = classmethod(_export)


# `from_pretrained(..., export=True, dynamo=True, <name>=...)` keyword -> export option (main_export's names)
RUNTIME_EXPORT_OPTIONS = {"optimize": "optimize_level", "quantize": "quantize", "quantize_head": "quantize_head",
                          "quantize_embeddings": "quantize_embeddings"}


def export_for_runtime(cls, model_id, config, use_cache: bool = True, trust_remote_code: bool = False, **kwargs):
    from optimum.exporters.tasks import TasksManager

    from .exporters import export_onnx
    from .tasks import with_past

    if kwargs.get("task") is not None:
        raise ValueError(f"`task` is inferred from {cls.__name__}; do not pass it")
    task = getattr(cls, "export_task", None) or TasksManager._infer_task_from_model_or_model_class(
        model_class=cls.auto_model_class)
    task = with_past(task, config) if use_cache else task
    hub = {k: kwargs.pop(k) for k in HUB_OPTIONS if k in kwargs}
    graph = {option: kwargs.pop(name) for name, option in RUNTIME_EXPORT_OPTIONS.items() if name in kwargs}
    save_dir = TemporaryDirectory()
    export_onnx(model_id, save_dir.name, task=task, trust_remote_code=trust_remote_code, hub_options=hub, **graph)
    if "use_cache" in inspect.signature(cls._from_pretrained).parameters:  # the generating classes' option only
        kwargs["use_cache"] = use_cache
    return cls._from_pretrained(Path(save_dir.name), config, model_save_dir=save_dir, **kwargs)


def patch_runtime(module) -> None:
    """Give the runtime classes defined in `module` the `dynamo=True` option of `_export`."""
    for name in dir(module):
        cls = getattr(module, name)
        if isinstance(cls, type) and "_export" in cls.__dict__ and not cls.__dict__.get("_optimum_dynamo"):
            if cls.__module__ == module.__name__:
                _wrap_export(cls)
                cls._optimum_dynamo = True


def patch_export_functions(module) -> None:
    """`dynamo=True` on optimum's `onnx_export_from_model` (in `convert`) and `main_export` (in `__main__`;
    `from optimum.exporters.onnx import main_export` reads that module's global)."""
    if module.__name__.endswith(".convert"):
        _wrap_python_export(module, "onnx_export_from_model", "model")
    else:
        _wrap_python_export(module, "main_export", "model_name_or_path")
