"""optimum-cli imports every file of `optimum.commands.register` before building its parser: this one adds
`--dynamo` to `optimum-cli export onnx` and `export executorch`, and puts back an export command whose package
is installed but whose register file another package overwrote (see `optimum_dynamo.commands`). Nothing with
OPTIMUM_DYNAMO_DISABLE=1."""

import os

REGISTER_COMMANDS = []
if os.environ.get("OPTIMUM_DYNAMO_DISABLE", "0") in ("", "0"):
    import optimum_dynamo  # noqa: F401  (installs the CLI flags and the legacy bridge)
    from optimum_dynamo.commands import export_commands

    REGISTER_COMMANDS = export_commands(__name__)
