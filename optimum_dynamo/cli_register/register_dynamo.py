"""optimum-cli imports every file of `optimum.commands.register` before building its parser: this one adds
`--dynamo` to `optimum-cli export onnx` and `export executorch`, and puts back an export command whose package
is installed but whose register file another package overwrote (see `optimum_dynamo.cli.register`). Nothing with
OPTIMUM_DYNAMO_DISABLE=1. A failure here is one line on stderr, never the end of optimum-cli."""

import os

REGISTER_COMMANDS = []
if os.environ.get("OPTIMUM_DYNAMO_DISABLE", "0") in ("", "0"):
    try:
        import optimum_dynamo  # noqa: F401  (installs the CLI flags and the legacy bridge)
        from optimum_dynamo.cli.register import export_commands

        REGISTER_COMMANDS = export_commands(__name__)
    except Exception as e:
        import sys

        print(f"optimum-dynamo: commands not registered ({type(e).__name__}: {e})", file=sys.stderr)
