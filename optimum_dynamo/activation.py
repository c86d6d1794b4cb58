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


def _call(where: str, name: str):
    """`optimum_dynamo.<where>.<name>(module)`, imported when first called (it imports logging, pathlib...)."""
    def call(module):
        import importlib

        return getattr(importlib.import_module(f"optimum_dynamo.{where}"), name)(module)

    return call


def _speech_lm(model_id, config, **kwargs):
    """What optimum's `ORTModelForSpeechSeq2Seq` loads a speech LLM's export with (legacy_bridge.ort_speech_lm)."""
    from .runtime.speech_lm import ORTModelForSpeechLM

    return ORTModelForSpeechLM._from_pretrained(model_id, config, **kwargs)


def install() -> None:
    """Apply the legacy bridge, and make `--dynamo` and `dynamo=True` reach optimum-dynamo once optimum's CLI
    or runtime is imported (idempotent)."""
    import legacy_bridge
    from legacy_bridge import ort_speech_lm
    from legacy_bridge.hooks import when_imported

    legacy_bridge.install()
    ort_speech_lm.use(_speech_lm)
    for module in _RUNTIME_MODULES:
        when_imported(module, _call("integration", "patch_runtime"))
    when_imported("optimum.commands.export.onnx", _call("cli.onnx", "install"))
    # optimum-executorch's command imports transformers.pipelines, and so torchao: its import-time warnings quieted
    when_imported("optimum.commands.export.executorch", _call("quiet", "while_importing"), before=True)
    when_imported("optimum.commands.export.executorch", _call("quiet", "imported"))
    when_imported("optimum.commands.export.executorch", _call("cli.executorch", "install"))
    for module in ("optimum.exporters.onnx.convert", "optimum.exporters.onnx.__main__"):
        when_imported(module, _call("integration", "patch_export_functions"))
