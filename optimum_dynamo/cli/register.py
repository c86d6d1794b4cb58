"""The `optimum-cli export` commands optimum-dynamo's register file adds.

optimum-onnx and optimum-executorch both ship `optimum/commands/register/register_export.py`: the package
installed last overwrites the other's file and that command disappears from `optimum-cli export`. optimum-cli
imports every file of the `optimum.commands.register` namespace; ours (`register_dynamo.py`) adds back each
export command whose package is installed but that no other register file registers, and its own `export
executorch` command when optimum-executorch is not installed. No file of either package is edited.

A command put back is imported only when the command line runs it: optimum-executorch's module imports
transformers.pipelines (torchvision, torch._dynamo: about 6 s), which every other optimum-cli call would pay.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

NAMESPACE = "optimum.commands.register"
# command name under `export` -> (module, class) of the package that provides it, and the help line
# `optimum-cli export --help` shows for it
EXPORT_COMMANDS = {
    "onnx": ("optimum.commands.export.onnx", "ONNXExportCommand", "Export PyTorch to ONNX"),
    "executorch": ("optimum.commands.export.executorch", "ExecuTorchExportCommand", "Export models to ExecuTorch."),
}


def registered_elsewhere(own: str) -> set[str]:
    """Names of the commands registered by the namespace's other files (imported as optimum-cli imports them;
    a file that fails to import is left for optimum-cli to report)."""
    from ..quiet import import_noise

    spec = importlib.util.find_spec(NAMESPACE)
    names = set()
    for directory in set(spec.submodule_search_locations or ()) if spec else ():
        for file in sorted(Path(directory).glob("*.py")):
            name = f"{NAMESPACE}.{file.stem}"
            if name == own:
                continue
            try:
                with import_noise():  # optimum-executorch's imports transformers.pipelines (torchao)
                    module = importlib.import_module(name)
            except Exception:
                continue
            for entry in getattr(module, "REGISTER_COMMANDS", []):
                command = entry[0] if isinstance(entry, tuple) else entry
                names.add(getattr(getattr(command, "COMMAND", command), "name", None))
    return names


def export_commands(own: str) -> list[tuple]:
    """REGISTER_COMMANDS entries for the export commands missing from `optimum-cli export`."""
    from optimum.commands.export.base import ExportCommand

    from ..quiet import import_noise

    present = registered_elsewhere(own)
    commands = []
    for name, (module, class_name, help_line) in EXPORT_COMMANDS.items():
        if name in present:
            continue
        if importlib.util.find_spec(module) is not None:  # installed; its register file was overwritten
            if sys.argv[1:3] != ["export", name]:  # not run by this command line: its name and help line only
                commands.append((_listed(name, help_line), ExportCommand))
                continue
            with import_noise():  # optimum-executorch's command imports transformers.pipelines (torchao)
                commands.append((getattr(importlib.import_module(module), class_name), ExportCommand))
        elif name == "executorch":
            from .executorch import command_class

            commands.append((command_class(), ExportCommand))
    return commands


def _listed(name: str, help_line: str) -> type:
    """A command optimum-cli lists under `export` without importing it (this command line does not run it)."""
    from optimum.commands.base import BaseOptimumCLICommand, CommandInfo

    return type(f"Listed{name.title()}Command", (BaseOptimumCLICommand,),
                {"COMMAND": CommandInfo(name=name, help=help_line)})


__all__ = ["EXPORT_COMMANDS", "export_commands", "registered_elsewhere"]
