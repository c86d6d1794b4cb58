"""The one run of an optimum-cli export command under `--dynamo`, configured by each command.

Every option of optimum's parser goes through the command's flag table (`flags.py`); option values and the
output path are checked before any work; bad input is one error line and exit status 1; an interrupt leaves
nothing written; when the dynamo export itself fails on a valid model, the command's fallback exporter takes
over with the same options (unless --no-fallback, or the command has none for this model).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .. import flags, quiet
from ..errors import ExportError, describe


@dataclass(frozen=True)
class Command:
    prog: str  # how its lines start: "optimum-cli export onnx --dynamo"
    table: dict[str, flags.Flag]  # one row per option
    defaults: Callable[[], dict[str, Any]]  # every option of the command's parser -> its default
    output: str  # the argument naming the output directory
    prepare: Callable[[Any, dict[str, Any]], Any]  # (args, resolved options) -> export options; ExportError on bad input
    export: Callable[[Any, Any, dict], Any]  # (args, export options, state) -> what was written
    fallback_name: str = ""  # "the torchscript exporter"
    # (args, state) -> why the fallback is not tried ("" if it is), and (args, state, reason) -> run it (None: none)
    no_fallback: Callable[[Any, dict], str] = lambda args, state: "--no-fallback" if args.no_fallback else ""
    fallback: Callable[[Any, dict, str], None] | None = None

    def error(self, message: str) -> SystemExit:
        return SystemExit(f"{self.prog}: error: {message}")


def run(command: Command, args) -> None:
    """Export `args` with the dynamo path (see the module's docstring)."""
    from ..staging import Terminated, check_output

    quiet.configure_cli(getattr(args, "verbose", False))
    defaults = command.defaults()
    values = {dest: getattr(args, dest) for dest in defaults if hasattr(args, dest)}
    output = getattr(args, command.output, None)
    try:
        resolved, notices = flags.resolve(values, defaults, command.table)
        options = command.prepare(args, resolved)
        if output is None:
            raise ExportError(f"{flags.spelling(command.output, command.table)} is required")
        check_output(output)
    except ExportError as e:
        raise command.error(str(e)) from None
    for notice in notices:
        print(f"{command.prog}: notice: {notice}", file=sys.stderr)
    state: dict[str, Any] = {}
    try:
        written = command.export(args, options, state)
    except ExportError as e:
        raise command.error(str(e)) from None
    except (KeyboardInterrupt, Terminated) as e:
        print(f"{command.prog}: error: interrupted ({type(e).__name__}); nothing was written", file=sys.stderr)
        raise SystemExit(130 if isinstance(e, KeyboardInterrupt) else 143) from None
    except Exception as e:  # the dynamo export failed on a valid model: the other exporter, if any
        quiet.logger().debug("the dynamo export's traceback:", exc_info=True)
        _fall_back(command, args, state, describe(e))
    else:
        quiet.logger().info("Exported to %s%s", Path(output).resolve(), f" ({written})" if written else "")


def _fall_back(command: Command, args, state: dict, reason: str) -> None:
    why_not = command.no_fallback(args, state)
    if why_not or command.fallback is None:
        raise command.error(f"dynamo export failed ({reason}); no fallback: {why_not or 'none'}")
    print(f"{command.prog}: warning: dynamo export failed ({reason}); falling back to {command.fallback_name} "
          "(--no-fallback to fail instead)", file=sys.stderr)
    try:
        command.fallback(args, state, reason)
    except ExportError as failure:
        raise command.error(str(failure)) from None


__all__ = ["Command", "run"]
