"""What `import optimum_dynamo` does, and so what the start-up hook (`optimum_dynamo_startup.pth`, run by
Python's `site` in every process of an environment that has the package) does: apply the legacy bridge and
register the optimum hooks, which take effect when optimum's modules are imported.

It runs at interpreter start-up, so it imports nothing but the bridge's hook module: the hooks' callbacks
import `integration` when optimum is imported. Opt out with OPTIMUM_DYNAMO_DISABLE=1 (start-up hook and
CLI registration; an explicit `import optimum_dynamo` still activates).
"""

from __future__ import annotations

DISABLE_VARIABLE = "OPTIMUM_DYNAMO_DISABLE"
_RUNTIME_MODULES = ("optimum.onnxruntime.modeling", "optimum.onnxruntime.modeling_decoder",
                    "optimum.onnxruntime.modeling_seq2seq")


def _integration(name: str):
    """`integration.<name>`, imported when first called (it imports logging, pathlib, tempfile...)."""
    def call(module):
        import importlib

        return getattr(importlib.import_module("optimum_dynamo.integration"), name)(module)

    return call


def install() -> None:
    """Apply the legacy bridge, and make `--dynamo` and `dynamo=True` reach optimum-dynamo once optimum's CLI
    or runtime is imported (idempotent)."""
    import legacy_bridge
    from legacy_bridge.hooks import when_imported

    legacy_bridge.install()
    for module in _RUNTIME_MODULES:
        when_imported(module, _integration("patch_runtime"))
    when_imported("optimum.commands.export.onnx", _integration("install_cli_command"))
    when_imported("optimum.commands.export.executorch", _integration("install_executorch_command"))
    for module in ("optimum.exporters.onnx.convert", "optimum.exporters.onnx.__main__"):
        when_imported(module, _integration("patch_export_functions"))
