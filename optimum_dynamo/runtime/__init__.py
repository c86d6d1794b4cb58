"""The package's own onnxruntime runners, for exports optimum's runtime classes cannot drive: state caches
(`steps.OnnxStepModel`) and vision-language components (`vlm.VlmRunner`, imported from its module)."""

from .steps import OnnxStepModel, STATE_LEAVES, drives_states

__all__ = ["OnnxStepModel", "STATE_LEAVES", "drives_states"]
