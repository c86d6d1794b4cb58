"""optimum-cli imports every file of `optimum.commands.register` before building its parser:
this one adds `--dynamo` to `optimum-cli export onnx` (not with OPTIMUM_DYNAMO_DISABLE=1)."""

import os

if os.environ.get("OPTIMUM_DYNAMO_DISABLE", "0") in ("", "0"):
    import optimum_dynamo  # noqa: F401  (installs the CLI flag and the legacy bridge)

REGISTER_COMMANDS = []
