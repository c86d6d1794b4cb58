"""Two Slices taking the two halves of a tensor's last axis become one Split (onnxscript's `slice_split_rule`).

onnxscript's rule is a pattern of two output nodes: its matcher lists the whole graph for every Slice it
visits, quadratic in the graph's size (165 s of a 40-layer zamba's 290 s export; 5 s at 12 layers). Here the
partner is looked up among the uses of the sliced value: linear. The conditions and the result are the rule's.
"""

from __future__ import annotations

import onnx_ir as ir


def _ints(value: ir.Value | None) -> list[int] | None:
    tensor = value.const_value if value is not None else None
    return None if tensor is None else tensor.numpy().reshape(-1).tolist()


def _half(node: ir.Node, first: bool) -> bool:
    """`node` slices one half (the first or the second) of its input's last axis, as the rule checks it."""
    if node.op_type != "Slice" or node.domain != "" or len(node.inputs) != 4 or node.outputs[0].is_graph_output():
        return False
    x, begin, end, axes = node.inputs
    shape, (b, e, a) = x.shape, (_ints(v) for v in node.inputs[1:])
    if shape is None or None in (b, e, a) or len(a) != 1 or a[0] not in (-1, len(shape) - 1):
        return False
    last = shape[-1]
    if not isinstance(last, int) or len(b) != 1 or len(e) != 1:
        return False
    return (b[0], e[0]) == ((0, last // 2) if first else (last // 2, last))


class SlicesSplit(ir.passes.InPlacePass):
    def call(self, model: ir.Model) -> ir.passes.PassResult:
        graph = model.graph
        if graph.opset_imports.get("", 0) < 18:  # Split's num_outputs
            return ir.passes.PassResult(model, False)
        order = {node: i for i, node in enumerate(graph)}
        done = set()
        for first in [n for n in graph if _half(n, True)]:
            second = next((n for n, _ in first.inputs[0].uses() if n not in done and n.graph is graph
                           and _half(n, False) and _ints(n.inputs[3]) == _ints(first.inputs[3])), None)
            if second is None or first in done:  # (an empty last axis: one Slice is both halves)
                continue
            x = first.inputs[0]
            split = ir.Node("", "Split", [x], [ir.AttrInt64("num_outputs", 2), ir.AttrInt64("axis", -1)],
                            num_outputs=2)
            at = min((first, second), key=order.__getitem__)
            ir.convenience.replace_nodes_and_values(graph, at, [first, second], [split],
                                                    [first.outputs[0], second.outputs[0]], list(split.outputs))
            done |= {first, second}
        return ir.passes.PassResult(model, bool(done))


__all__ = ["SlicesSplit"]
