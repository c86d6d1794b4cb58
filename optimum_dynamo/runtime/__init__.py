"""The package's own onnxruntime runners: a greedy loop for state caches without optimum
(`steps.OnnxStepModel`; `ORTModelForCausalLM` runs them too) and vision-language components
(`image_text_to_text.ORTModelForImageTextToText`, imported from its module)."""

from .steps import OnnxStepModel, STATE_LEAVES, drives_states

__all__ = ["OnnxStepModel", "STATE_LEAVES", "drives_states"]
