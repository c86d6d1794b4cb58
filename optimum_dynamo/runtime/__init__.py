"""The package's own onnxruntime loop for exports optimum's runtime classes cannot drive (state caches)."""

from .steps import OnnxStepModel, STATE_LEAVES, drives_states

__all__ = ["OnnxStepModel", "STATE_LEAVES", "drives_states"]
