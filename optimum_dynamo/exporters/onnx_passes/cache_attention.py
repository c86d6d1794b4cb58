"""Attention over a growing key/value cache -> ONNX `Attention` given the cache (`--optimize O3`).

The translated decoder attends with ONNX `Attention` on the cache grown in the graph:

    Attention(q, Concat(past_key, k, axis=-2), Concat(past_value, v, axis=-2), mask)

(heads-first [batch, heads, seq, head_dim], key/value heads unrepeated). The pass gives the kernel the cache
instead (`past_key` / `past_value` inputs: it appends the new keys and values itself) and token-major
[batch, seq, heads * head_dim] inputs, taken from before the heads-first reshape when the graph has one
(rotary embeddings then run token-major too); otherwise transposed. The graph's own mask is kept, so left
padding and sliding windows behave exactly as the mask says, and every call shape is served.

onnxruntime's contrib `GroupQueryAttention` was used before: its CPU kernel refuses several rows continuing by
several tokens over a non-empty cache, which took an `If` per layer, and with it a decode step measured 3-8%
slower than this graph's (onnxruntime 1.31, one and two threads, batch 1 and 4; benchmarks/decode_step.py).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from . import CONTRIB_DOMAIN, NodeRewrite


class CacheAttention(NodeRewrite):
    """Each ONNX Attention over a grown cache, given the cache instead."""

    name, op_type = "cache_attention", "Attention"
    none_found = "no ONNX Attention in the graph (SDPA was not translated to it)"

    def match(self, node: ir.Node):
        return _match(node)

    def rewrite(self, graph: ir.Graph, node: ir.Node, *found) -> None:
        _rewrite(graph, node, *found)


def _dims(value: ir.Value | None) -> list | None:
    return None if value is None or value.shape is None else list(value.shape)


def _grown(value: ir.Value) -> tuple[ir.Node, ir.Value, ir.Value] | None:
    """(the Concat, past, new) when `value` = Concat(past, new) along the sequence axis of a 4D cache."""
    concat = value.producer()
    if concat is None or concat.op_type != "Concat" or concat.domain != "" or len(concat.inputs) != 2:
        return None
    if concat.attributes.get_int("axis") not in (2, -2) or any(v is None for v in concat.inputs):
        return None
    return concat, concat.inputs[0], concat.inputs[1]


def _match(node: ir.Node):
    """(heads, kv_heads, head_dim, key concat, value concat) of a rewritable Attention, else why not."""
    if len(node.inputs) > 4:
        return "attention is given its cache as inputs (not grown in the graph)"
    if any(output.uses() or output.is_graph_output() for output in node.outputs[1:]):
        return "attention's present key/value or scores are read"
    query, key, value = node.inputs[:3]
    mask = node.inputs[3] if len(node.inputs) > 3 else None
    if query is None or query.dtype != ir.DataType.FLOAT:
        return "attention's query is not float32"
    if mask is None or len(_dims(mask) or []) != 4:
        return "attention has no 4D mask (a causal flag instead)"  # the graph's own mask is what the kernel gets
    key_cache, value_cache = _grown(key), _grown(value)
    q_dims, k_dims = _dims(query), _dims(key_cache[2]) if key_cache else None
    if key_cache is None or value_cache is None:
        return "attention is not over a grown cache (key/value not Concat(past, new) on a 4D cache's sequence axis)"
    if q_dims is None or k_dims is None or len(q_dims) != 4 or len(k_dims) != 4:
        return "attention's query/key shapes are unknown or not 4D (heads-first)"
    heads, kv_heads, head_dim = q_dims[1], k_dims[1], q_dims[3]
    if not all(isinstance(d, int) for d in (heads, kv_heads, head_dim)) or heads % kv_heads:
        return f"attention heads {heads} / key-value heads {kv_heads} / head size {head_dim}: not static or not grouped"
    return heads, kv_heads, head_dim, key_cache, value_cache


def _const(graph: ir.Graph, name: str, array: np.ndarray) -> ir.Value:
    """An initializer shared by every rewritten attention."""
    if name not in graph.initializers:
        graph.register_initializer(ir.Value(name=name, const_value=ir.tensor(array)))
    return graph.initializers[name]


def _rewrite(graph: ir.Graph, node: ir.Node, heads: int, kv_heads: int, head_dim: int, key_cache, value_cache):
    query, mask = node.inputs[0], node.inputs[3]
    key_concat, past_key, key = key_cache
    value_concat, past_value, value = value_cache
    new: list[ir.Node] = []

    def op(op_type, inputs, domain="", outputs=1, **attributes):
        made = ir.node(op_type, inputs, attributes=attributes, domain=domain, num_outputs=outputs)
        new.append(made)
        return made.outputs if outputs > 1 else made.outputs[0]

    token_major = _const(graph, "attention_token_major", np.array([0, 0, -1], dtype=np.int64))

    def tokens(x: ir.Value, count: int) -> ir.Value:
        return _token_major(x, count, op, token_major)

    q, k, v = tokens(query, heads), tokens(key, kv_heads), tokens(value, kv_heads)
    options = {k: node.attributes[k].value for k in ("scale", "softcap") if k in node.attributes}
    attended, present_key, present_value = op("Attention", [q, k, v, mask, past_key, past_value], outputs=3,
                                              q_num_heads=heads, kv_num_heads=kv_heads, **options)
    q_dims = _dims(query)
    attended.shape, attended.type = ir.Shape([q_dims[0], q_dims[2], heads * head_dim]), query.type
    graph.insert_before(node, new)
    _replace_heads_first(graph, node, node.outputs[0], attended, heads, head_dim)
    for concat, present in ((key_concat, present_key), (value_concat, present_value)):
        old = concat.outputs[0]
        present.shape, present.type = old.shape, old.type
        name, old.name = old.name, None
        old.replace_all_uses_with(present, replace_graph_outputs=True)
        present.name = name
    # the replaced nodes are left unused: the optimizer's dead-code removal takes them out


def _token_major(x: ir.Value, heads: int, op, token_major: ir.Value) -> ir.Value:
    """[batch, seq, heads * head_dim] form of heads-first `x`: the value before the graph's own reshape and
    transpose (through a rotary embedding, run token-major instead), else a transpose and reshape."""
    producer = x.producer()
    rotary = producer if producer is not None and producer.op_type == "RotaryEmbedding" and \
        producer.domain == CONTRIB_DOMAIN else None
    source = _before_heads_first(rotary.inputs[0] if rotary else x)
    if source is not None and rotary is not None:
        attributes = {k: a.value for k, a in rotary.attributes.items()}
        return op("RotaryEmbedding", [source, *rotary.inputs[1:]], domain=CONTRIB_DOMAIN, **{**attributes, "num_heads": heads})
    if source is not None:
        return source
    return op("Reshape", [op("Transpose", [x], perm=[0, 2, 1, 3]), token_major])


def _before_heads_first(x: ir.Value) -> ir.Value | None:
    """`s` when x = Transpose(Reshape(s, [batch, seq, heads, head_dim]), perm=[0, 2, 1, 3]) and s is 3D."""
    transpose = x.producer()
    if transpose is None or transpose.op_type != "Transpose" or list(transpose.attributes.get_ints("perm", [])) != [0, 2, 1, 3]:
        return None
    reshape = transpose.inputs[0].producer() if transpose.inputs[0] is not None else None
    if reshape is None or reshape.op_type != "Reshape" or reshape.inputs[0] is None:
        return None
    source = reshape.inputs[0]
    dims, split = _dims(source), _dims(reshape.outputs[0])
    if dims is None or split is None or len(dims) != 3 or len(split) != 4:
        return None
    if not (isinstance(dims[2], int) and isinstance(split[2], int) and isinstance(split[3], int)) or \
            dims[2] != split[2] * split[3]:
        return None
    return source


def _replace_heads_first(graph: ir.Graph, node: ir.Node, old: ir.Value, attended: ir.Value, heads: int,
                         head_dim: int) -> None:
    """Consumers of the heads-first output read the token-major result: directly when they only turned it
    back to token-major (Transpose + Reshape to 3D), else through a reshape and transpose."""
    uses = old.uses()
    if len(uses) == 1 and uses[0].node.op_type == "Transpose" and \
            list(uses[0].node.attributes.get_ints("perm", [])) == [0, 2, 1, 3]:
        back = uses[0].node.outputs[0].uses()
        if len(back) == 1 and back[0].node.op_type == "Reshape" and len(_dims(back[0].node.outputs[0]) or []) == 3:
            back[0].node.outputs[0].replace_all_uses_with(attended, replace_graph_outputs=True)
            return
    shape = _const(graph, f"attention_heads_first_{heads}x{head_dim}", np.array([0, 0, heads, head_dim], dtype=np.int64))
    split = ir.node("Reshape", [attended, shape])
    transpose = ir.node("Transpose", [split.outputs[0]], attributes={"perm": [0, 2, 1, 3]})
    graph.insert_before(node, [split, transpose])
    old.replace_all_uses_with(transpose.outputs[0], replace_graph_outputs=True)


__all__ = ["CacheAttention"]
