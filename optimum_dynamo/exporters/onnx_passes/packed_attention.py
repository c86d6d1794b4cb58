"""GroupQueryAttention fed the three parts of one packed q/k/v projection (`pack_matmuls`' Split) reads the
packed projection instead (its packed-QKV form). The Split then moves into the If branch that still reads the
parts (the attention for the calls GroupQueryAttention's kernel refuses), so a step that GroupQueryAttention
serves does not run it."""

from __future__ import annotations

import onnx_ir as ir

from . import note_fused, note_unfused
from .group_query_attention import CONTRIB_DOMAIN


def _sizes(split: ir.Node) -> list[int] | None:
    sizes = split.inputs[1] if len(split.inputs) > 1 else None
    if sizes is None or sizes.const_value is None:
        return None
    return [int(s) for s in sizes.const_value.numpy().tolist()]


def _packed_split(node: ir.Node) -> ir.Node | None:
    """The Split whose outputs 0, 1, 2 are this GroupQueryAttention's query, key and value, sized by its heads."""
    q, k, v = node.inputs[:3]
    split = q.producer() if q is not None else None
    if split is None or split.op_type != "Split" or split.domain != "" or len(split.outputs) != 3:
        return None
    if list(split.outputs) != [q, k, v] or split.attributes.get_int("axis", 0) not in (-1, 2):
        return None
    sizes, heads = _sizes(split), node.attributes.get_int("num_heads", 0)
    kv_heads = node.attributes.get_int("kv_num_heads", 0)
    if sizes is None or not heads or not kv_heads or sizes[1] != sizes[2] or sizes[0] * kv_heads != sizes[1] * heads:
        return None
    return split


def _branch_holding(graph: ir.Graph, users: set[ir.Node]) -> ir.Graph | None:
    """The branch of an If of `graph` whose nodes (subgraphs included) are all of `users`, if one is."""
    for node in graph:
        if node.op_type != "If":
            continue
        for attribute in node.attributes.values():
            branch = attribute.value
            if users <= set(ir.traversal.RecursiveGraphIterator(branch)):
                return branch
    return None


def pack_attention_inputs(model: ir.Model) -> int:
    """Rewrite in place; return the number of GroupQueryAttention nodes fed a packed projection."""
    splits, count = set(), 0
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        if node.op_type == "GroupQueryAttention" and node.domain == CONTRIB_DOMAIN:
            split = _packed_split(node)
            if split is not None:
                node.replace_input_with(0, split.inputs[0])
                node.replace_input_with(1, None)
                node.replace_input_with(2, None)
                splits.add(split)
                count += 1
    for split in splits:
        graph = split.graph
        users = {use.node for output in split.outputs for use in output.uses()}
        branch = _branch_holding(graph, users) if graph is not None and users else None
        if branch is not None and not any(output.is_graph_output() for output in split.outputs):
            graph.remove(split)
            branch.insert_before(branch[0], split)
    return count


class PackAttentionInputs(ir.passes.InPlacePass):
    """`pack_attention_inputs`."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        count = pack_attention_inputs(model)
        if count:
            note_fused(model, "packed_attention_inputs", count)
        else:
            note_unfused(model, "packed_attention_inputs", "no GroupQueryAttention reads the parts of a packed q/k/v")
        return ir.passes.PassResult(model, count > 0)


__all__ = ["PackAttentionInputs", "pack_attention_inputs"]
