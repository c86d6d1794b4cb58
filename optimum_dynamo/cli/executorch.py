"""`optimum-cli export executorch --dynamo`: a `.pte` for ExecuTorch through optimum-dynamo's pipeline.

With optimum-executorch installed, its `export executorch` command gets `--dynamo` (as `export onnx` does) and
falls back to optimum-executorch's own exporter when the dynamo export fails. Without it, optimum-dynamo
registers an `export executorch` command with the same flags (`command_class`), which always exports with
the dynamo path. Every flag goes through the table below: honoured, or refused with the reason.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..flags import HONOURED, REFUSED, Flag
from ..migration import ENV
from .arguments import Option, add_options, defaults
from .driver import Command, run
from .wrap import wrap_command

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

OPTIONS = (
    Option(("--dynamo",), dict(action=argparse.BooleanOptionalAction, default=None,
                               help="Export with optimum-dynamo: inputs and the dynamic prompt length are inferred by "
                               f"running the model, no per-model code. {ENV}=1 makes it the default (without "
                               "optimum-executorch, optimum-dynamo is this command's only exporter)."),
           take_over=True),
    Option(("--atol",), dict(type=float, default=None,
                             help="With --dynamo: fail when an output of the .pte differs from PyTorch by more.")),
    Option(("-v", "--verbose"), dict(action="store_true", help="With --dynamo: show debug lines.")),
    Option(("--no-fallback",), dict(action="store_true",
                                    help="With --dynamo: fail instead of falling back to optimum-executorch's exporter.")),
)


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


def _prepare(args, resolved: dict) -> dict:
    from ..options import check_atol

    check_atol(resolved.get("atol"))
    resolved.pop("task", None)  # text-generation, checked by the table
    if resolved.get("max_seq_len") is None:
        resolved.pop("max_seq_len", None)  # export_executorch's default
    return resolved


def _export(args, options: dict, state: dict) -> str:
    from ..exporters.executorch import export_executorch

    export_executorch(args.model, args.output_dir, task="text-generation-with-past", **options)
    return ""


def _command(build, fallback=None) -> Command:
    """`build(parser)`: the command's parser; `fallback(args)`: optimum-executorch's exporter, if installed."""
    return Command(
        PROG, table=FLAGS, defaults=lambda: defaults(build, ["--model", "M"]), output="output_dir", prepare=_prepare,
        export=_export, fallback_name="optimum-executorch's exporter",
        no_fallback=(lambda args, state: "--no-fallback" if args.no_fallback else "") if fallback
        else (lambda args, state: "optimum-executorch is not installed"),
        fallback=fallback and (lambda args, state, reason: fallback(args)))


def _own_parser(parser) -> None:
    parse_args(parser)
    add_options(parser, OPTIONS)


def command_class():
    """The `export executorch` command registered when optimum-executorch is not installed."""
    from optimum.commands.base import BaseOptimumCLICommand, CommandInfo

    command = _command(_own_parser)

    class ExecuTorchCommand(BaseOptimumCLICommand):
        COMMAND = CommandInfo(name="executorch", help="Export models to ExecuTorch (.pte) with optimum-dynamo.")

        @staticmethod
        def parse_args(parser):
            _own_parser(parser)

        def run(self):
            if self.args.dynamo is False:
                raise command.error("--no-dynamo: optimum-executorch is not installed, optimum-dynamo is the only "
                                    "exporter of this command (pip install optimum-executorch, or drop --no-dynamo)")
            run(command, self.args)

    return ExecuTorchCommand


def install(module) -> None:
    """`--dynamo` (and --atol, -v, --no-fallback) on optimum-executorch's `ExecuTorchExportCommand`
    (`optimum.commands.export.executorch`)."""
    def build(parser):
        module.parse_args_executorch(parser)
        add_options(parser, OPTIONS)

    def run_dynamo(self, original_run):
        run(_command(build, fallback=lambda args: original_run(self)), self.args)

    wrap_command(module.ExecuTorchExportCommand, OPTIONS, run_dynamo, _command(build).error)


__all__ = ["FLAGS", "OPTIONS", "PROG", "command_class", "install", "parse_args"]
