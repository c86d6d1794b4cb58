"""`optimum-cli export onnx --dynamo`: optimum-onnx's command with this package's options and pipeline; the
torchscript exporter (optimum-onnx's own) is the fallback."""

from __future__ import annotations

import argparse
from pathlib import Path

from .. import flags
from ..errors import ExportError, describe
from ..migration import ENV, torchscript_chosen
from ..options import QUANTIZE
from .arguments import Option, add_options, defaults
from .driver import Command, run
from .wrap import wrap_command

PROG = "optimum-cli export onnx --dynamo"

OPTIONS = (
    Option(("--dynamo",), dict(
        action=argparse.BooleanOptionalAction, default=None,
        help="Export with torch.export and the dynamo ONNX exporter (optimum-dynamo): inputs and dynamic axes are "
        f"inferred by running the model, no per-model configuration is needed. {ENV}=1 makes it the default; "
        "--no-dynamo uses the torchscript exporter; OPTIMUM_DYNAMO_DISABLE=1 gives optimum its own meaning back."),
        take_over=True),
    Option(("--pt2",), dict(action="store_true", help="With --dynamo: also write the torch.export program, model.pt2 "
                            "(load it with optimum_dynamo.load_program).")),
    Option(("--aoti",), dict(action="store_true", help="With --dynamo: also write an AOTInductor package, "
                             "model_aoti.pt2 (compiled C++; load it with optimum_dynamo.load_package).")),
    Option(("--quantize",), dict(choices=QUANTIZE, default=None, help="With --dynamo: store the weights of "
                                 "the linear layers in 4 or 8 bits (onnxruntime MatMulNBits, blocks of 32, symmetric), "
                                 "after --optimize; validated against the fp32 graph. Decoder tasks.")),
    Option(("--quantize-head",), dict(action=argparse.BooleanOptionalAction, default=True, help="With --quantize: "
                                      "quantize the vocabulary projection too (default), or keep it in fp32.")),
    Option(("--quantize-embeddings",), dict(action="store_true", help="With --quantize int4: store the token "
                                            "embeddings in 4 bits too (default: kept in fp32).")),
    Option(("-v", "--verbose"), dict(action="store_true",
                                     help="With --dynamo: show debug lines and the libraries' own messages.")),
    Option(("--no-fallback",), dict(action="store_true", help="With --dynamo: fail instead of falling back to the "
                                    "torchscript exporter when the dynamo export fails.")),
)


def _defaults() -> dict:
    from optimum.commands.export.onnx import parse_args_onnx  # optimum's parser, before our options

    return defaults(lambda parser: (parse_args_onnx(parser), add_options(parser, OPTIONS)), ["--model", "M", "OUT"])


def _prepare(args, resolved: dict):
    from ..options import ExportOptions, check_level  # light: a bad value is refused before torch is imported

    options = ExportOptions.make(**resolved)
    check_level(options.optimize_level)
    return options


def _export(args, options, state: dict) -> str:
    from ..target import resolve

    try:
        state["target"] = resolve(args.model, options)  # once: the export and the fallback read it
    except ExportError:
        raise
    except Exception as e:  # nothing to fall back on: the legacy exporter needs the same resolution
        raise ExportError(f"cannot resolve {args.model}'s task ({describe(e)})") from None
    from ..exporters.entry import export_target  # after the checks: a bad input is refused before the exporters load

    return export_target(state["target"], args.output, options, attempt=state).task.name


def _no_fallback(args, state: dict) -> str:
    from legacy_bridge.torchscript import has_onnx_config

    target = state["target"]
    if args.no_fallback:
        return "--no-fallback"
    dynamo_only = _dynamo_only(args)
    if dynamo_only:
        return f"{dynamo_only} needs the dynamo path"
    if not has_onnx_config(target.config.model_type, target.task_name):
        return f"no torchscript OnnxConfig for {target.config.model_type}/{target.task_name}"
    return ""


def _legacy_options(args) -> dict:
    """The options optimum's own `export onnx` command passes to `main_export`."""
    return dict(opset=args.opset, atol=args.atol, optimize=args.optimize, trust_remote_code=args.trust_remote_code,
                device=args.device, dtype=args.dtype, pad_token_id=args.pad_token_id, model_kwargs=args.model_kwargs,
                do_constant_folding=not args.no_constant_folding, library_name=args.library_name,
                monolith=args.monolith, no_post_process=args.no_post_process, _variant=args.variant,
                slim=args.slim, cache_dir=args.cache_dir, do_validation=False)


def _torchscript(args, state: dict, reason: str) -> None:
    """The torchscript exporter on the same model and task (resolved once by `_export`); optimum's
    `main_export` runs with its dynamo switch off, whichever optimum-onnx defines one."""
    from legacy_bridge.torchscript import export_torchscript

    from ..manifest import write_fallback_manifest
    from ..staging import staged
    from ..validate.fallback import FallbackMismatch, check_fallback

    target = state["target"]
    try:
        with staged(Path(args.output)) as staging, torchscript_chosen():  # a failed fallback leaves nothing
            export_torchscript(args.model, staging, target.task_name, **_legacy_options(args))
            check_fallback(staging, state.get("context"), args.dtype)
            write_fallback_manifest(staging, model=args.model, task=target.task_name, reason=reason)
    except FallbackMismatch as e:  # its graph is wrong on the captured inputs
        raise ExportError(f"dynamo export failed ({reason}); {e}") from None
    except Exception as e:
        raise ExportError(f"dynamo export failed ({reason}); the torchscript fallback failed too "
                          f"({describe(e)})") from e


COMMAND = Command(PROG, table=flags.FLAGS, defaults=_defaults, output="output", prepare=_prepare, export=_export,
                  fallback_name="the torchscript exporter", no_fallback=_no_fallback, fallback=_torchscript)


def _dynamo_only(args) -> str:
    """The options set that only the dynamo path honours (the torchscript exporter would drop them)."""
    found = [spelling for dest, spelling in (("pt2", "--pt2"), ("aoti", "--aoti"), ("quantize", "--quantize"))
             if getattr(args, dest, None)]
    if getattr(args, "quantize_head", True) is False:
        found.append("--no-quantize-head")
    if getattr(args, "quantize_embeddings", False):
        found.append("--quantize-embeddings")
    return "/".join(found)


def _run_torchscript(command, original_run) -> None:
    from legacy_bridge.torchscript import deprecation_notice, task_has_onnx_configs

    from ..tasks import SUPPORTED

    dynamo_only = _dynamo_only(command.args)
    if dynamo_only:  # never dropped: the torchscript exporter has no such option
        raise COMMAND.error(f"{dynamo_only}: only the dynamo exporter has this option; add --dynamo "
                            "(for the torchscript export's weights: optimum-cli onnxruntime quantize)")
    task = command.args.task
    if task and task.removesuffix("-with-past") in SUPPORTED and not task_has_onnx_configs(task):
        # optimum would fail deep in its export with a traceback (image-text-to-text: "custom or unsupported")
        raise SystemExit(f"optimum-cli export onnx: error: --task {task}: the torchscript exporter has no "
                         "export for this task (no OnnxConfig of any model); add --dynamo")
    deprecation_notice()
    original_run(command)


def install(module) -> None:
    """`--dynamo` on optimum-onnx's `export onnx` command (`optimum.commands.export.onnx`)."""
    wrap_command(module.ONNXExportCommand, OPTIONS, lambda command, original_run: run(COMMAND, command.args),
                 COMMAND.error, _run_torchscript)


__all__ = ["COMMAND", "OPTIONS", "PROG", "install"]
