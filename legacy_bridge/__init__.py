"""Runtime bridges that let optimum-onnx 0.1.0 work on transformers 5 and fix its runtime bugs.

Call `install()` before importing optimum.exporters.onnx or optimum.onnxruntime.
"""

from . import ort_absorbed_inputs, ort_audio, ort_optimizer, ort_runtime, ort_seq2seq, ort_speech_lm, transformers5


def install() -> None:
    """Apply every shim and patch (idempotent; imports nothing heavy)."""
    transformers5.install()
    ort_runtime.install()
    ort_audio.install()
    ort_speech_lm.install()
    ort_seq2seq.install()
    ort_absorbed_inputs.install()
    ort_optimizer.install()
