"""optimum-cli imports every file of `optimum.commands.register` before building its parser:
this one adds `--dynamo` to `optimum-cli export onnx`."""

import optimum_dynamo  # noqa: F401  (installs the CLI flag and the legacy bridge)

REGISTER_COMMANDS = []
