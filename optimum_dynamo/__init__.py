"""optimum-dynamo: the torch.export-based ONNX exporter behind optimum's `--dynamo` flag.

Importing it is cheap (a few milliseconds, no torch, transformers or optimum): it installs the legacy bridge
and the optimum hooks, which take effect when optimum's modules are imported. Installed packages do this at
interpreter start-up (`optimum_dynamo_startup.pth`, see `activation`), so nobody needs to import it.
"""

__version__ = "0.1.0.dev0"

from .activation import install

install()

# The Python API, imported on first use (torch is not imported by `import optimum_dynamo`).
_API = {
    "observe": "optimum_dynamo.capture",
    "InputObserver": "optimum_dynamo.input_observer",
    "infer_arguments": "optimum_dynamo.capture",
    "export_observed": "optimum_dynamo.exporters",
    "export_onnx": "optimum_dynamo.exporters",
    "export_vlm": "optimum_dynamo.exporters.vision_language",
    "export_executorch": "optimum_dynamo.exporters.executorch",
    "PteCausalLM": "optimum_dynamo.runtime.executorch",
    "ORTModelForImageTextToText": "optimum_dynamo.runtime.image_text_to_text",
    "ORTModelForImageTextToTextSeq2Seq": "optimum_dynamo.runtime.image_text_to_text_seq2seq",
    "ORTModelForSpeechLM": "optimum_dynamo.runtime.speech_lm",
    "load_program": "optimum_dynamo.exporters.pt2",
    "load_package": "optimum_dynamo.exporters.pt2",
    "package_io": "optimum_dynamo.exporters.pt2",
}


# Names removed before the first release -> what replaces them.
_REMOVED = {"VlmRunner": "ORTModelForImageTextToText (optimum_dynamo.ORTModelForImageTextToText.from_pretrained(directory)"
                         ".generate(**processor(images=..., text=...)))"}


def __getattr__(name):
    if name in _REMOVED:
        raise AttributeError(f"optimum_dynamo.{name} was removed: use {_REMOVED[name]}")
    if name in _API:
        import importlib

        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'optimum_dynamo' has no attribute {name!r}")


__all__ = ["__version__", "install", *_API]
