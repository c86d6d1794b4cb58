"""Give an optimum CLI command class optimum-dynamo's options and run, at run time (no optimum file edited)."""

from __future__ import annotations

import functools

from ..errors import ExportError
from ..migration import torchscript_chosen, use_dynamo
from .arguments import add_options


def wrap_command(command_class, options, run_dynamo, error, run_original=None) -> None:
    """After optimum's own parser is built, `options` are added (`arguments.add_options`). With --dynamo (or
    the environment's default) `run_dynamo(self, original_run)` runs, else `run_original(self, original_run)`
    (default: the command's own run). `error(message)` makes the one error line. Idempotent."""
    if command_class.__dict__.get("_optimum_dynamo"):
        return
    parse_args, run = command_class.parse_args, command_class.run

    def parse_args_with_dynamo(parser):
        parse_args(parser)
        add_options(parser, options)

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


__all__ = ["wrap_command"]
