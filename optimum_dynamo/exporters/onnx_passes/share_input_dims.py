"""One `Shape` read per set of named input axes."""

from __future__ import annotations

import onnx_ir as ir


def share_input_dims(graph: ir.Graph) -> int:
    """Axes that carry one name have one size: the names are the graph's contract with its runtime (every
    layer's `past_sequence_length`; a bounded sliding cache's axis has a name of its own). What is computed
    from them (masks, lengths) is then computed once, not once per layer. Returns the number of reads removed."""
    first: dict[tuple[str, ...], ir.Value] = {}
    removed = 0
    for node in list(graph):
        if node.op_type != "Shape" or node.domain != "" or node.inputs[0] is None or not node.inputs[0].is_graph_input():
            continue
        dims = list(node.inputs[0].shape or [])
        start, end = node.attributes.get_int("start", 0), node.attributes.get_int("end", len(dims))
        picked = dims[start:end]
        if not picked or not all(isinstance(d, ir.SymbolicDim) and d.value for d in picked):
            continue
        key = tuple(d.value for d in picked)
        if key not in first:
            first[key] = node.outputs[0]
            continue
        node.outputs[0].replace_all_uses_with(first[key])
        graph.remove(node, safe=True)
        removed += 1
    return removed


class ShareInputDims(ir.passes.InPlacePass):
    """`share_input_dims` on the main graph."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        return ir.passes.PassResult(model, share_input_dims(model.graph) > 0)
