"""`optimum-cli export executorch --dynamo`: a `.pte` for ExecuTorch through optimum-dynamo's pipeline.

With optimum-executorch installed, its `export executorch` command gets `--dynamo` (as `export onnx` does) and
falls back to optimum-executorch's own exporter when the dynamo export fails. Without it, optimum-dynamo
registers an `export executorch` command with the same flags (`ExecuTorchCommand`), which always exports with
the dynamo path. Every flag goes through the table below: honoured, or refused with the reason.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import quiet
from .errors import ExportError
from .flags import HONOURED, REFUSED, Flag

PROG = "optimum-cli export executorch --dynamo"
QUANTIZATION = ("qlinear", "qlinear_group_size", "qlinear_packing_format", "qlinear_encoder",
                "qlinear_encoder_group_size", "qlinear_encoder_packing_format", "qembedding", "qembedding_group_size",
                "qembedding_encoder", "qembedding_encoder_group_size")
_QUANTIZED = "quantization is not supported with --dynamo yet; drop it or export without --dynamo"
_CUSTOM_OPS = "(ExecuTorch custom ops) is not supported with --dynamo; drop it or export without --dynamo"


def _choice(allowed: tuple, why: str):
    return lambda value: None if value in (None, *allowed) else why


FLAGS: dict[str, Flag] = {
    "model": Flag("--model", HONOURED, "checkpoint directory or hub id"),
    "output_dir": Flag("--output_dir", HONOURED, "output directory (written only when every stage passed)"),
    "task": Flag("--task", HONOURED, "text-generation (decoder language models)", "task",
                 check=_choice(("text-generation", "text-generation-with-past"),
                               "only text-generation is exported to ExecuTorch with --dynamo")),
    "recipe": Flag("--recipe", HONOURED, "xnnpack (the CPU backend)", "recipe",
                   check=_choice(("xnnpack",), "only the xnnpack recipe is supported with --dynamo")),
    "max_seq_len": Flag("--max_seq_len", HONOURED, "positions of the KV cache held in the program: prompt + generated "
                        "tokens; default 128 (optimum-executorch's own exporter: the config's max_position_embeddings)",
                        "max_seq_len"),
    "dtype": Flag("--dtype", HONOURED, "float32", check=_choice(("float32",), "only float32 is exported to "
                  "ExecuTorch with --dynamo yet")),
    "device": Flag("--device", HONOURED, "cpu", check=_choice(("cpu",), "exporting on another device than cpu is "
                   "not supported with --dynamo; the .pte runs on any XNNPACK device")),
    "use_custom_sdpa": Flag("--use_custom_sdpa", REFUSED, _CUSTOM_OPS),
    "use_custom_kv_cache": Flag("--use_custom_kv_cache", REFUSED, _CUSTOM_OPS),
    "disable_dynamic_shapes": Flag("--disable_dynamic_shapes", REFUSED, "is not supported with --dynamo: the "
                                   "prompt length is dynamic (one-call prefill); drop it"),
    **{dest: Flag(f"--{dest}", REFUSED, _QUANTIZED) for dest in QUANTIZATION},
    # added by optimum-dynamo
    "dynamo": Flag("--dynamo", HONOURED, "selects this exporter"),
    "atol": Flag("--atol", HONOURED, "the export fails when an output of the .pte differs from PyTorch by more", "atol"),
    "no_fallback": Flag("--no-fallback", HONOURED, "fail instead of falling back to optimum-executorch's exporter"),
    "verbose": Flag("-v/--verbose", HONOURED, "shows debug lines and the libraries' own messages"),
}


def error(message: str) -> SystemExit:
    return SystemExit(f"{PROG}: error: {message}")


def add_arguments(parser, own_command: bool = False) -> None:
    """optimum-dynamo's options of `export executorch`."""
    from .migration import ENV

    group = parser.add_argument_group("optimum-dynamo")
    if own_command:
        group.add_argument("--dynamo", action=argparse.BooleanOptionalAction, default=None,
                           help="Export with torch.export through optimum-dynamo (the only exporter of this command "
                           "when optimum-executorch is not installed).")
    else:
        group.add_argument("--dynamo", action=argparse.BooleanOptionalAction, default=None,
                           help="Export with optimum-dynamo: inputs and the dynamic prompt length are inferred by "
                           f"running the model, no per-model code. {ENV}=1 makes it the default.")
    group.add_argument("--atol", type=float, default=None,
                       help="With --dynamo: fail when an output of the .pte differs from PyTorch by more.")
    group.add_argument("-v", "--verbose", action="store_true", help="With --dynamo: show debug lines.")
    group.add_argument("--no-fallback", action="store_true",
                       help="With --dynamo: fail instead of falling back to optimum-executorch's exporter.")


def parse_args(parser) -> None:
    """The flags of optimum-executorch's `export executorch`, for the command registered without it."""
    parser.add_argument("-m", "--model", type=str, required=True, help="Model ID on the Hub or local directory.")
    parser.add_argument("-o", "--output_dir", type=Path, help="Directory to write model.pte and its files to.")
    parser.add_argument("--task", type=str, default="text-generation", help="Task to export (text-generation).")
    parser.add_argument("--recipe", type=str, default="xnnpack", help="ExecuTorch recipe (xnnpack).")
    parser.add_argument("--max_seq_len", type=int, help="KV cache positions: prompt + generated tokens (default 128).")
    parser.add_argument("--dtype", type=str, choices=["float32", "float16", "bfloat16"], help="Weights dtype (float32).")
    parser.add_argument("--device", type=str, help="Device to export on (cpu).")
    for dest in ("use_custom_sdpa", "use_custom_kv_cache", "disable_dynamic_shapes"):
        parser.add_argument(f"--{dest}", action="store_true", help="Not supported with --dynamo.")
    for dest in QUANTIZATION:
        parser.add_argument(f"--{dest}", type=str, help="Quantization: not supported with --dynamo yet.")
    add_arguments(parser, own_command=True)


def defaults_of(parse) -> dict:
    """Every option of a parser built by `parse` (dest -> default)."""
    parser = argparse.ArgumentParser()
    parse(parser)
    return vars(parser.parse_args(["--model", "MODEL"]))


def run_cli(args, parse, fallback=None) -> None:
    """Export `args` with the dynamo path; `parse` builds the command's parser (its defaults tell which
    options were set); `fallback(args)` runs optimum-executorch's exporter when the dynamo export fails."""
    from .flags import resolve
    from .options import check_atol
    from .staging import Terminated, check_output

    quiet.configure_cli(getattr(args, "verbose", False))
    defaults = defaults_of(parse)
    values = {dest: getattr(args, dest) for dest in defaults if hasattr(args, dest)}
    try:
        options, notices = resolve(values, defaults, FLAGS)
        check_atol(options.get("atol"))
        if args.output_dir is None:
            raise ExportError("--output_dir is required")
        check_output(args.output_dir)
    except ExportError as e:
        raise error(str(e)) from None
    for notice in notices:
        print(f"{PROG}: notice: {notice}", file=sys.stderr)
    options.pop("task", None)
    if options.get("max_seq_len") is None:
        options.pop("max_seq_len", None)  # export_executorch's default
    try:
        from .exporters.executorch import export_executorch

        export_executorch(args.model, args.output_dir, task="text-generation-with-past", **options)
    except ExportError as e:
        raise error(str(e)) from None
    except (KeyboardInterrupt, Terminated) as e:
        print(f"{PROG}: error: interrupted ({type(e).__name__}); nothing was written", file=sys.stderr)
        raise SystemExit(130 if isinstance(e, KeyboardInterrupt) else 143) from None
    except Exception as e:  # the dynamo export failed on a valid model
        reason = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
        if fallback is None or args.no_fallback:
            why = "--no-fallback" if fallback is not None else "optimum-executorch is not installed"
            raise error(f"dynamo export failed ({reason}); no fallback: {why}") from None
        print(f"{PROG}: warning: dynamo export failed ({reason}); falling back to optimum-executorch's exporter "
              "(--no-fallback to fail instead)", file=sys.stderr)
        fallback(args)
    else:
        quiet.logger().info("Exported to %s", Path(args.output_dir).resolve())


def command_class():
    """The `export executorch` command registered when optimum-executorch is not installed."""
    from optimum.commands.base import BaseOptimumCLICommand, CommandInfo

    class ExecuTorchCommand(BaseOptimumCLICommand):
        COMMAND = CommandInfo(name="executorch", help="Export models to ExecuTorch (.pte) with optimum-dynamo.")

        @staticmethod
        def parse_args(parser):
            parse_args(parser)

        def run(self):
            if self.args.dynamo is False:
                raise error("--no-dynamo: optimum-executorch is not installed, optimum-dynamo is the only exporter "
                            "of this command (pip install optimum-executorch, or drop --no-dynamo)")
            run_cli(self.args, parse_args)

    return ExecuTorchCommand


def install(module) -> None:
    """Add `--dynamo` (and --atol, -v, --no-fallback) to optimum-executorch's `ExecuTorchExportCommand`."""
    from .integration import wrap_command

    def parse(parser):
        module.parse_args_executorch(parser)
        add_arguments(parser)

    def run_dynamo(self, original_run):
        run_cli(self.args, parse, fallback=lambda args: original_run(self))

    wrap_command(module.ExecuTorchExportCommand, add_arguments, run_dynamo, error)


__all__ = ["FLAGS", "PROG", "add_arguments", "command_class", "install", "parse_args", "run_cli"]
