"""optimum hooks: `--dynamo` on `optimum-cli export onnx`, and `ORTModel*.from_pretrained(export=True, dynamo=True)`.

Both wrap optimum objects at run time (never editing optimum's files) and are idempotent.
"""

from __future__ import annotations

import functools
import logging
import sys
from pathlib import Path
from tempfile import TemporaryDirectory

from legacy_bridge._hooks import when_imported

from .errors import ExportError

_HUB_OPTIONS = ("subfolder", "revision", "force_download", "local_files_only", "cache_dir", "token")


def add_cli_arguments(parser) -> None:
    group = parser.add_argument_group("optimum-dynamo")
    group.add_argument(
        "--dynamo",
        action="store_true",
        help="Export with torch.export and the dynamo ONNX exporter (optimum-dynamo): inputs and dynamic "
        "axes are inferred by running the model, no per-model configuration is needed.",
    )
    group.add_argument(
        "--no-fallback",
        action="store_true",
        help="With --dynamo: fail instead of falling back to the torchscript exporter when the dynamo export fails.",
    )


def _error(message: str) -> SystemExit:
    return SystemExit(f"optimum-cli export onnx --dynamo: error: {message}")


def run_cli(args) -> None:
    """`optimum-cli export onnx --dynamo ...`: one error line and exit status 1 on bad input; when the
    dynamo export itself fails, the torchscript exporter takes over (unless --no-fallback)."""
    from .exporters import export_onnx

    logger = logging.getLogger("optimum_dynamo")
    if not logger.handlers:
        logger.addHandler(logging.StreamHandler())
        logger.setLevel(logging.INFO)
        logger.propagate = False
    if args.no_dynamic_axes:
        raise _error("--no-dynamic-axes is not supported with --dynamo")
    options = dict(opset=args.opset, atol=args.atol, trust_remote_code=args.trust_remote_code,
                   hub_options={"cache_dir": args.cache_dir} if args.cache_dir else {})
    options["optimize_level"] = args.optimize
    try:
        ctx = export_onnx(args.model, args.output, task=args.task, **options)
    except ExportError as e:
        raise _error(str(e)) from None
    except Exception as e:  # the dynamo export failed on a valid model: try the legacy exporter
        _fall_back(args, e)
    else:
        logger.info("Exported to %s (%s)", Path(args.output).resolve(), ctx.task.name)


def _fall_back(args, error: Exception) -> None:
    from legacy_bridge.torchscript import export_torchscript, has_onnx_config
    from transformers import AutoConfig

    from .manifest import write_fallback_manifest
    from .staging import staged
    from .tasks import resolve_task

    reason = f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0]}"
    config = AutoConfig.from_pretrained(args.model, trust_remote_code=args.trust_remote_code)
    task = resolve_task(args.task, args.model, config).name
    if args.no_fallback or not has_onnx_config(config.model_type, task):
        why = "--no-fallback" if args.no_fallback else f"no torchscript OnnxConfig for {config.model_type}/{task}"
        raise _error(f"dynamo export failed ({reason}); no fallback: {why}") from error
    print(f"optimum-cli export onnx --dynamo: warning: dynamo export failed ({reason}); "
          "falling back to the torchscript exporter (--no-fallback to fail instead)", file=sys.stderr)
    with staged(Path(args.output)) as staging:  # a failed fallback leaves nothing behind either
        export_torchscript(args.model, staging, task, opset=args.opset, atol=args.atol, optimize=args.optimize,
                           trust_remote_code=args.trust_remote_code, do_validation=False)
        write_fallback_manifest(staging, model=args.model, task=task, reason=reason)


def install_cli(command_class) -> None:
    if command_class.__dict__.get("_optimum_dynamo"):
        return
    parse_args, run = command_class.parse_args, command_class.run

    def parse_args_with_dynamo(parser):
        parse_args(parser)
        add_cli_arguments(parser)

    @functools.wraps(run)
    def run_with_dynamo(self):
        if getattr(self.args, "dynamo", False):
            return run_cli(self.args)
        from legacy_bridge.torchscript import deprecation_notice

        deprecation_notice()
        return run(self)

    command_class.parse_args = staticmethod(parse_args_with_dynamo)
    command_class.run = run_with_dynamo
    command_class._optimum_dynamo = True


def _wrap_export(cls) -> None:
    """`cls._export(..., dynamo=True)` exports with optimum-dynamo; otherwise unchanged."""
    original = cls.__dict__["_export"].__func__

    @functools.wraps(original)
    def _export(klass, model_id, config, *args, dynamo: bool = False, **kwargs):
        if not dynamo:
            return original(klass, model_id, config, *args, **kwargs)
        return export_for_runtime(klass, model_id, config, **kwargs)

    cls._export = classmethod(_export)


def export_for_runtime(cls, model_id, config, use_cache: bool = True, trust_remote_code: bool = False, **kwargs):
    from optimum.exporters.tasks import TasksManager

    from .exporters import export_onnx
    from .tasks import ENCODER_DECODER_TASKS

    if kwargs.get("task") is not None:
        raise ValueError(f"`task` is inferred from {cls.__name__}; do not pass it")
    task = TasksManager._infer_task_from_model_or_model_class(model_class=cls.auto_model_class)
    if use_cache and (task == "text-generation" or task in ENCODER_DECODER_TASKS):
        task += "-with-past"
    hub = {k: kwargs.pop(k) for k in _HUB_OPTIONS if k in kwargs}
    save_dir = TemporaryDirectory()
    export_onnx(model_id, save_dir.name, task=task, trust_remote_code=trust_remote_code, hub_options=hub)
    return cls._from_pretrained(Path(save_dir.name), config, use_cache=use_cache, model_save_dir=save_dir, **kwargs)


def _patch_runtime(module) -> None:
    for name in dir(module):
        cls = getattr(module, name)
        if isinstance(cls, type) and "_export" in cls.__dict__ and not cls.__dict__.get("_optimum_dynamo"):
            if cls.__module__ == module.__name__:
                _wrap_export(cls)
                cls._optimum_dynamo = True


def install() -> None:
    """Apply the legacy bridge, and make `dynamo=True` reach optimum-dynamo once optimum's runtime is imported."""
    import legacy_bridge

    legacy_bridge.install()
    for module in ("optimum.onnxruntime.modeling", "optimum.onnxruntime.modeling_decoder",
                   "optimum.onnxruntime.modeling_seq2seq"):
        when_imported(module, _patch_runtime)
    when_imported("optimum.commands.export.onnx", lambda m: install_cli(m.ONNXExportCommand))
