"""Recurrent-state graphs in ORTModelForCausalLM (optimum-onnx 0.1.0 and its main branch, 1939f27).

A `--dynamo` export of a state-space or hybrid model (mamba, jamba, zamba2, lfm2, qwen3_5, ...) takes one
token per call and carries `past_key_values.N.conv_state` / `.recurrent_state` next to any `N.key` /
`N.value` (docs/caches.md). optimum's runtime knows key/value caches only: its `__init__` reads head
counts that these configs lack, and its `forward` feeds key/value inputs only. For a session with state
inputs, the patched class initialises without that bookkeeping and its `forward` runs `StateGraph`:
every past input starts as zeros (batch axis set, any other named axis 0) and is then fed the matching
`present.*` output of the step before; a prompt goes in one token per call with its mask. `generate`
carries the states as optimum carries key/value caches: a tuple of per-layer tuples.
"""

from __future__ import annotations

PAST, PRESENT = "past_key_values.", "present."
STATE_LEAVES = ("conv_state", "recurrent_state")

_NUMPY = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(double)": "float64",
          "tensor(int64)": "int64", "tensor(int32)": "int32", "tensor(bool)": "bool"}


def drives_states(names) -> bool:
    """True when `names` (graph inputs or outputs) carry state leaves."""
    return any(n.rsplit(".", 1)[-1].rstrip("_0123456789") in STATE_LEAVES for n in names)


class StateGraph:
    """An onnxruntime session of a one-token state graph, run over any number of tokens."""

    def __init__(self, session):
        self.session = session
        self.inputs = {i.name: i for i in session.get_inputs()}
        self.output_names = [o.name for o in session.get_outputs()]
        self.past_names = [n for n in self.inputs if n.startswith(PAST)]
        missing = [n for n in self.past_names if PRESENT + n[len(PAST):] not in self.output_names]
        if missing:
            raise ValueError(f"inputs {missing} have no matching present.* output")
        if self.inputs["input_ids"].shape[1] != 1:
            raise ValueError("a state graph takes one token per call (input_ids [batch, 1])")
        # state-only graphs take the step's mask column; hybrids (attention layers too) the whole mask
        mask = self.inputs.get("attention_mask")
        self.full_mask = mask is not None and mask.shape[1] != 1

    def zero_state(self, batch: int) -> list:
        import numpy as np

        state = []
        for name in self.past_names:
            arg = self.inputs[name]
            shape = [batch if axis == 0 else (d if isinstance(d, int) else 0) for axis, d in enumerate(arg.shape)]
            state.append(np.zeros(shape, dtype=_NUMPY[arg.type]))
        return state

    def run(self, input_ids, attention_mask, state, past: int, position_ids=None):
        """Tokens [batch, n] after `past` earlier ones -> (logits [batch, n, vocab], next state).

        `attention_mask` covers the past and the new tokens (None: all attended); `position_ids`, if the
        graph takes them, cover the new tokens (None: counted from `past`)."""
        import numpy as np

        ids = np.asarray(input_ids, dtype=np.int64)
        batch, length = ids.shape
        mask = np.ones((batch, past + length), np.int64) if attention_mask is None else np.asarray(attention_mask, np.int64)
        logits = []
        for t in range(length):
            now = past + t
            feed = {"input_ids": ids[:, t : t + 1], **dict(zip(self.past_names, state))}
            if "attention_mask" in self.inputs:
                feed["attention_mask"] = mask[:, : now + 1] if self.full_mask else mask[:, now : now + 1]
            if "cache_position" in self.inputs:
                feed["cache_position"] = np.array([now], dtype=np.int64)
            if "position_ids" in self.inputs:
                feed["position_ids"] = (np.full((batch, 1), now, np.int64) if position_ids is None
                                        else np.asarray(position_ids, np.int64)[:, t : t + 1])
            outputs = dict(zip(self.output_names, self.session.run(self.output_names, feed)))
            logits.append(outputs["logits"][:, -1:])
            state = [outputs[PRESENT + n[len(PAST):]] for n in self.past_names]
        return np.concatenate(logits, axis=1), state

    def layers(self, state) -> tuple:
        """The flat state grouped per layer (the leading number of each name)."""
        grouped: dict[str, list] = {}
        for name, value in zip(self.past_names, state):
            grouped.setdefault(name[len(PAST):].split(".", 1)[0], []).append(value)
        return tuple(tuple(values) for values in grouped.values())


def is_state_session(session) -> bool:
    return session is not None and drives_states(i.name for i in session.get_inputs())


def adopt(model, generation_config) -> None:
    """The attributes ORTModelForCausalLM's own `__init__` sets, for a state graph."""
    model.state_graph = StateGraph(model.session)
    model.key_value_input_names = [n for n in model.input_names if n.startswith(PAST)]
    model.key_value_output_names = [n for n in model.output_names if n.startswith(PRESENT)]
    model.can_use_cache = True
    model.is_merged = False
    model.generation_config = generation_config
    model.old_bloom_modeling = model.old_gpt_bigcode_modeling = False
    model.num_key_value_heads = model.embed_size_per_head = None


def _past_length(model, past_key_values, attention_mask, length: int, cache_position) -> int:
    if past_key_values is None:
        return 0
    if attention_mask is not None:
        return attention_mask.shape[1] - length
    if cache_position is not None:
        return int(cache_position.reshape(-1)[0])
    flat = [v for layer in past_key_values for v in layer]
    keys = [v for n, v in zip(model.state_graph.past_names, flat) if n.endswith(".key")]
    if keys:
        return keys[0].shape[-2]
    if model.state_graph.full_mask or "cache_position" in model.input_names or "position_ids" in model.input_names:
        raise ValueError("a state graph needs attention_mask or cache_position after the first call")
    return 0  # state-only graph without positions: the state is all it needs


def forward(model, input_ids, attention_mask=None, past_key_values=None, position_ids=None, use_cache=None, **kwargs):
    """ORTModelForCausalLM.forward for a state graph (torch or numpy in, the same out)."""
    import numpy as np
    import torch
    from transformers.modeling_outputs import CausalLMOutputWithPast

    from . import cache_argument

    use_torch = isinstance(input_ids, torch.Tensor)

    def numpy(value):
        return None if value is None else (value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value))

    length = input_ids.shape[1]
    past = _past_length(model, past_key_values, attention_mask, length, kwargs.get("cache_position"))
    if past_key_values is None:
        state = model.state_graph.zero_state(input_ids.shape[0])
    else:
        state = [numpy(v) for layer in past_key_values for v in layer]
    logits, state = model.state_graph.run(numpy(input_ids), numpy(attention_mask), state, past, numpy(position_ids))
    if use_torch:
        logits, state = torch.from_numpy(logits), [torch.from_numpy(s) for s in state]
    use_cache = use_cache if use_cache is not None else model.config.use_cache
    state = model.state_graph.layers(state) if use_cache else None
    return CausalLMOutputWithPast(logits=logits, **{cache_argument.name(): state})
