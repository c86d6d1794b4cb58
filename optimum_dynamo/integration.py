"""optimum hooks: `--dynamo` on `optimum-cli export onnx`, and `ORTModel*.from_pretrained(export=True, dynamo=True)`.

Both wrap optimum objects at run time (never editing optimum's files) and are idempotent.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path
from tempfile import TemporaryDirectory

from . import quiet
from .errors import ExportError
from .migration import ENV, torchscript_chosen, use_dynamo

_HUB_OPTIONS = ("subfolder", "revision", "force_download", "local_files_only", "cache_dir", "token")


def add_cli_arguments(parser) -> None:
    group = parser.add_argument_group("optimum-dynamo")
    group.add_argument(
        "--dynamo",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="Export with torch.export and the dynamo ONNX exporter (optimum-dynamo): inputs and dynamic "
        f"axes are inferred by running the model, no per-model configuration is needed. {ENV}=1 makes it "
        "the default; --no-dynamo uses the torchscript exporter.",
    )
    group.add_argument("--pt2", action="store_true", help="With --dynamo: also write the torch.export program, model.pt2 "
                       "(load it with optimum_dynamo.load_program).")
    group.add_argument("--aoti", action="store_true", help="With --dynamo: also write an AOTInductor package, "
                       "model_aoti.pt2 (compiled C++; load it with optimum_dynamo.load_package).")
    group.add_argument("-v", "--verbose", action="store_true", help="With --dynamo: show debug lines and the libraries' own messages.")
    group.add_argument(
        "--no-fallback",
        action="store_true",
        help="With --dynamo: fail instead of falling back to the torchscript exporter when the dynamo export fails.",
    )


def _error(message: str) -> SystemExit:
    return SystemExit(f"optimum-cli export onnx --dynamo: error: {message}")


def run_cli(args) -> None:
    """`optimum-cli export onnx --dynamo ...`: every option of optimum's parser goes through the flag
    table (`flags.py`); option values and the output path are checked before any work; one error line and
    exit status 1 on bad input; when the dynamo export itself fails, the torchscript exporter takes over
    with the same options (unless --no-fallback)."""
    from . import flags
    from .exporters.entry import export_target
    from .exporters.onnx_optimize import check_level
    from .options import ExportOptions
    from .staging import Terminated, check_output
    from .target import resolve

    quiet.configure_cli(getattr(args, "verbose", False))
    logger = quiet.logger()
    defaults = {**flags.cli_defaults(), "dynamo": None, "no_fallback": False, "verbose": False, "pt2": False,
                "aoti": False}
    values = {dest: getattr(args, dest) for dest in defaults if hasattr(args, dest)}
    try:
        resolved, notices = flags.resolve(values, defaults)
        options = ExportOptions.make(**resolved)
        check_level(options.optimize_level)
        check_output(args.output)
    except ExportError as e:
        raise _error(str(e)) from None
    for notice in notices:
        print(f"optimum-cli export onnx --dynamo: notice: {notice}", file=sys.stderr)
    target = None
    try:
        target = resolve(args.model, options)  # once: the export and the fallback read it
        ctx = export_target(target, args.output, options)
    except ExportError as e:
        raise _error(str(e)) from None
    except (KeyboardInterrupt, Terminated) as e:
        print(f"optimum-cli export onnx --dynamo: error: interrupted ({type(e).__name__}); nothing was written",
              file=sys.stderr)
        raise SystemExit(130 if isinstance(e, KeyboardInterrupt) else 143) from None
    except Exception as e:  # the dynamo export failed on a valid model: try the legacy exporter
        if target is None:  # nothing to fall back on: the legacy exporter needs the same resolution
            raise _error(f"cannot resolve {args.model}'s task ({type(e).__name__}: "
                         f"{(str(e).strip().splitlines() or [''])[0]})") from None
        try:
            _fall_back(args, target, e)
        except ExportError as failure:
            raise _error(str(failure)) from None
    else:
        logger.info("Exported to %s (%s)", Path(args.output).resolve(), ctx.task.name)


def _legacy_options(args) -> dict:
    """The options optimum's own `export onnx` command passes to `main_export`."""
    return dict(opset=args.opset, atol=args.atol, optimize=args.optimize, trust_remote_code=args.trust_remote_code,
                device=args.device, dtype=args.dtype, pad_token_id=args.pad_token_id, model_kwargs=args.model_kwargs,
                do_constant_folding=not args.no_constant_folding, library_name=args.library_name,
                monolith=args.monolith, no_post_process=args.no_post_process, _variant=args.variant,
                slim=args.slim, cache_dir=args.cache_dir, do_validation=False)


def _fall_back(args, target, error: Exception) -> None:
    """The torchscript exporter on the same model and task (`target`, resolved once by `run_cli`)."""
    from legacy_bridge.torchscript import export_torchscript, has_onnx_config

    from .manifest import write_fallback_manifest
    from .staging import staged

    reason = f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0]}"
    config, task = target.config, target.task_name
    programs = getattr(args, "pt2", False) or getattr(args, "aoti", False)
    if args.no_fallback or programs or not has_onnx_config(config.model_type, task):
        why = ("--no-fallback" if args.no_fallback else "--pt2/--aoti need the dynamo path" if programs
               else f"no torchscript OnnxConfig for {config.model_type}/{task}")
        raise _error(f"dynamo export failed ({reason}); no fallback: {why}") from error
    print(f"optimum-cli export onnx --dynamo: warning: dynamo export failed ({reason}); "
          "falling back to the torchscript exporter (--no-fallback to fail instead)", file=sys.stderr)
    try:
        with staged(Path(args.output)) as staging, torchscript_chosen():  # a failed fallback leaves nothing
            export_torchscript(args.model, staging, task, **_legacy_options(args))
            write_fallback_manifest(staging, model=args.model, task=task, reason=reason)
    except Exception as e:
        first = (str(e).strip().splitlines() or [""])[0]
        raise _error(f"dynamo export failed ({reason}); the torchscript fallback failed too "
                     f"({type(e).__name__}: {first})") from e


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


def wrap_command(command_class, add_arguments, run_dynamo, error, run_original=None) -> None:
    """Give an optimum CLI command optimum-dynamo's options (`add_arguments(parser)`): with --dynamo (or the
    environment's default) `run_dynamo(self, original_run)` runs, else `run_original(self, original_run)`
    (default: the command's own run). `error(message)` makes the one error line. Idempotent."""
    if command_class.__dict__.get("_optimum_dynamo"):
        return
    parse_args, run = command_class.parse_args, command_class.run

    def parse_args_with_dynamo(parser):
        parse_args(parser)
        add_arguments(parser)

    @functools.wraps(run)
    def run_with_dynamo(self):
        try:
            dynamo = use_dynamo(getattr(self.args, "dynamo", None))
        except ExportError as e:
            raise error(str(e)) from None
        if dynamo:
            return run_dynamo(self, run)
        with torchscript_chosen():
            return run_original(self, run) if run_original else run(self)

    command_class.parse_args = staticmethod(parse_args_with_dynamo)
    command_class.run = run_with_dynamo
    command_class._optimum_dynamo = True


def _run_torchscript(command, run) -> None:
    from legacy_bridge.torchscript import deprecation_notice

    deprecation_notice()
    run(command)


def install_cli(command_class) -> None:
    """`--dynamo` on optimum-onnx's `export onnx` command."""
    wrap_command(command_class, add_cli_arguments, lambda command, run: run_cli(command.args), _error,
                 _run_torchscript)


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


def export_for_runtime(cls, model_id, config, use_cache: bool = True, trust_remote_code: bool = False, **kwargs):
    from optimum.exporters.tasks import TasksManager

    from .exporters import export_onnx
    from .tasks import with_past

    if kwargs.get("task") is not None:
        raise ValueError(f"`task` is inferred from {cls.__name__}; do not pass it")
    task = TasksManager._infer_task_from_model_or_model_class(model_class=cls.auto_model_class)
    task = with_past(task, config) if use_cache else task
    hub = {k: kwargs.pop(k) for k in _HUB_OPTIONS if k in kwargs}
    save_dir = TemporaryDirectory()
    export_onnx(model_id, save_dir.name, task=task, trust_remote_code=trust_remote_code, hub_options=hub)
    return cls._from_pretrained(Path(save_dir.name), config, use_cache=use_cache, model_save_dir=save_dir, **kwargs)


def patch_runtime(module) -> None:
    """Give the runtime classes defined in `module` the `dynamo=True` option of `_export`."""
    for name in dir(module):
        cls = getattr(module, name)
        if isinstance(cls, type) and "_export" in cls.__dict__ and not cls.__dict__.get("_optimum_dynamo"):
            if cls.__module__ == module.__name__:
                _wrap_export(cls)
                cls._optimum_dynamo = True


def install_cli_command(module) -> None:
    """Add `--dynamo` to `optimum.commands.export.onnx.ONNXExportCommand`."""
    install_cli(module.ONNXExportCommand)


def install_executorch_command(module) -> None:
    """Add `--dynamo` to optimum-executorch's `optimum.commands.export.executorch.ExecuTorchExportCommand`."""
    from .executorch_cli import install

    install(module)


def patch_export_functions(module) -> None:
    """`dynamo=True` on optimum's `onnx_export_from_model` (in `convert`) and `main_export` (in `__main__`;
    `from optimum.exporters.onnx import main_export` reads that module's global)."""
    if module.__name__.endswith(".convert"):
        _wrap_python_export(module, "onnx_export_from_model", "model")
    else:
        _wrap_python_export(module, "main_export", "model_name_or_path")
