"""Greedy generation over an exported state model (Mamba, hybrids) without optimum's runtime.

`ORTModelForCausalLM` runs these exports itself once `legacy_bridge` is installed (it is, whenever this
package is); this small loop is for scripts without optimum. Both drive the graph with
`legacy_bridge.ort_states.StateGraph`: one token per call, states fed back, the prompt token by token.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from legacy_bridge.ort_states import STATE_LEAVES, StateGraph, drives_states

__all__ = ["OnnxStepModel", "STATE_LEAVES", "drives_states"]


class OnnxStepModel:
    """`OnnxStepModel(directory).generate(input_ids, attention_mask, max_new_tokens)` -> new tokens."""

    def __init__(self, directory, providers=("CPUExecutionProvider",), file_name: str = "model.onnx"):
        import onnxruntime as ort

        self.graph = StateGraph(ort.InferenceSession(str(Path(directory) / file_name), providers=list(providers)))

    def generate(self, input_ids, attention_mask=None, max_new_tokens: int = 8, return_logits: bool = False):
        """Greedy tokens [batch, max_new_tokens] (and the logits that chose each, if asked)."""
        ids = np.asarray(input_ids, dtype=np.int64)
        mask = np.ones_like(ids) if attention_mask is None else np.asarray(attention_mask, dtype=np.int64)
        logits, state = self.graph.run(ids, mask, self.graph.zero_state(ids.shape[0]), 0)
        tokens, scores = [], []
        for _ in range(max_new_tokens):
            scores.append(logits[:, -1])
            tokens.append(scores[-1].argmax(-1)[:, None])
            if len(tokens) == max_new_tokens:
                break
            past = mask.shape[1]
            mask = np.concatenate([mask, np.ones((mask.shape[0], 1), dtype=mask.dtype)], axis=1)
            logits, state = self.graph.run(tokens[-1], mask, state, past)
        tokens = np.concatenate(tokens, axis=1)
        return (tokens, np.stack(scores, axis=1)) if return_logits else tokens
