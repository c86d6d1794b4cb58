"""Greedy generation over an exported state model (Mamba), one token per call, with onnxruntime.

optimum's ORTModelForCausalLM feeds `past_key_values.N.key/.value` only; a state export takes
`past_key_values.N.conv_state` / `.recurrent_state` (see docs/caches.md). This loop reads the graph's
inputs and outputs: every `past_key_values.<leaf>` input starts as zeros shaped like the graph's input
(its batch axis set, any other named axis 0) and is fed the `present.<leaf>` output of the previous
step. The prompt goes in one token per call with its attention-mask column (left padding is masked
out of the state), then greedy tokens.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

PAST, PRESENT = "past_key_values.", "present."
STATE_LEAVES = ("conv_state", "recurrent_state")


def drives_states(names) -> bool:
    """True when `names` (graph inputs or outputs) carry state leaves."""
    return any(n.rsplit(".", 1)[-1].rstrip("_0123456789") in STATE_LEAVES for n in names)


_NUMPY = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
          "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(bool)": np.bool_}


class OnnxStepModel:
    """`OnnxStepModel(directory).generate(input_ids, attention_mask, max_new_tokens)` -> new tokens."""

    def __init__(self, directory, providers=("CPUExecutionProvider",), file_name: str = "model.onnx"):
        import onnxruntime as ort

        self.session = ort.InferenceSession(str(Path(directory) / file_name), providers=list(providers))
        self.inputs = {i.name: i for i in self.session.get_inputs()}
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.past_names = [n for n in self.inputs if n.startswith(PAST)]
        missing = [n for n in self.past_names if PRESENT + n[len(PAST):] not in self.output_names]
        if missing:
            raise ValueError(f"inputs {missing} have no matching present.* output")
        if self.inputs["input_ids"].shape[1] != 1:
            raise ValueError("this loop drives graphs that take one token per call (input_ids [batch, 1])")
        # state-only graphs take the step's mask column; hybrids (attention layers too) the whole mask
        mask = self.inputs.get("attention_mask")
        self.full_mask = mask is not None and mask.shape[1] != 1

    def zero_state(self, batch: int) -> dict[str, np.ndarray]:
        state = {}
        for name in self.past_names:
            arg = self.inputs[name]
            shape = [batch if axis == 0 else (d if isinstance(d, int) else 0) for axis, d in enumerate(arg.shape)]
            state[name] = np.zeros(shape, dtype=_NUMPY[arg.type])
        return state

    def step(self, token: np.ndarray, mask: np.ndarray, state: dict[str, np.ndarray], position: int):
        """One token per row ([batch, 1]) and the mask the graph takes (its last column, or the whole
        mask so far for hybrids) -> (logits [batch, vocab], next state)."""
        feed = {"input_ids": token.astype(np.int64), **state}
        if "attention_mask" in self.inputs:
            feed["attention_mask"] = mask.astype(np.int64)
        if "cache_position" in self.inputs:
            feed["cache_position"] = np.array([position], dtype=np.int64)
        outputs = dict(zip(self.output_names, self.session.run(self.output_names, feed)))
        return outputs["logits"][:, -1], {n: outputs[PRESENT + n[len(PAST):]] for n in self.past_names}

    def generate(self, input_ids, attention_mask=None, max_new_tokens: int = 8, return_logits: bool = False):
        """Greedy tokens [batch, max_new_tokens] (and the logits that chose each, if asked)."""
        ids = np.asarray(input_ids, dtype=np.int64)
        mask = np.ones_like(ids) if attention_mask is None else np.asarray(attention_mask, dtype=np.int64)
        batch, length = ids.shape
        state, tokens, scores = self.zero_state(batch), [], []
        for t in range(length + max_new_tokens - 1):
            logits, state = self.step(ids[:, t : t + 1], mask[:, 0 if self.full_mask else t : t + 1], state, t)
            if t >= length - 1:
                scores.append(logits)
                tokens.append(logits.argmax(-1))
                ids = np.concatenate([ids, tokens[-1][:, None]], axis=1)
                mask = np.concatenate([mask, np.ones((batch, 1), dtype=mask.dtype)], axis=1)
        tokens = np.stack(tokens, axis=1)
        return (tokens, np.stack(scores, axis=1)) if return_logits else tokens
