"""MatMuls that read one activation with constant weights (q/k/v projections, gate/up) become one MatMul on
the concatenated weights, followed by a Split: fewer, larger matrix products for onnxruntime's CPU kernels.
Each output element is the same dot product as before."""

from __future__ import annotations

import collections
import logging

import numpy as np
import onnx_ir as ir

logger = logging.getLogger(__name__)


def packable_weight(node: ir.Node) -> ir.TensorProtocol | None:
    """The constant 2D weight of a standard MatMul, read by this node only (not read: it may be a weight
    streamed from the checkpoint); else None."""
    if node.op_type != "MatMul" or node.domain != "" or len(node.inputs) != 2:
        return None
    weight = node.inputs[1]
    if weight is None or not weight.is_initializer() or weight.const_value is None or weight.is_graph_output():
        return None
    if len(weight.uses()) != 1 or weight.shape is None or len(weight.shape) != 2:
        return None
    return weight.const_value


def pack_matmuls(model: ir.Model) -> int:
    """Pack in place; return the number of MatMuls removed."""
    graph = model.graph
    order = {node: i for i, node in enumerate(graph)}
    groups: dict[ir.Value, list[tuple[ir.Node, ir.TensorProtocol]]] = collections.defaultdict(list)
    for node in graph:
        weight = packable_weight(node)
        if weight is not None and node.inputs[0] is not None:
            groups[node.inputs[0]].append((node, weight))
    removed = 0
    for activation, members in groups.items():
        members = [(n, w) for n, w in members if w.dtype == members[0][1].dtype and w.shape[0] == members[0][1].shape[0]]
        if len(members) < 2:
            continue
        members.sort(key=lambda m: order[m[0]])
        first = members[0][0]
        label = first.name or f"matmul_{order[first]}"
        packed = ir.Value(name=f"{label}_packed_weight", const_value=_concatenated([w for _, w in members]))
        graph.register_initializer(packed)
        sizes = ir.Value(name=f"{label}_packed_sizes",
                         const_value=ir.tensor(np.array([w.shape[1] for _, w in members], dtype=np.int64)))
        graph.register_initializer(sizes)
        matmul = ir.node("MatMul", [activation, packed], name=f"{label}_packed")
        split = ir.node("Split", [matmul.outputs[0], sizes], attributes={"axis": -1}, num_outputs=len(members),
                        name=f"{label}_split")
        graph.insert_before(first, [matmul, split])
        for (node, _), output in zip(members, split.outputs):
            output.shape, output.type = node.outputs[0].shape, node.outputs[0].type
            old_weight = node.inputs[1]
            node.outputs[0].replace_all_uses_with(output)
            graph.remove(node, safe=True)
            graph.initializers.pop(old_weight.name, None)
            old_weight.const_value = None  # memory: the removed value may outlive the graph; its array must not
        removed += len(members) - 1
    return removed


def _concatenated(tensors: list[ir.TensorProtocol]) -> ir.LazyTensor:
    """The weights side by side (axis 1), made when read (saved, quantized): packing copies no weight while the
    originals (views of the model's weights, or weights still in the checkpoint) are alive."""
    shape = ir.Shape([tensors[0].shape[0], sum(t.shape[1] for t in tensors)])
    return ir.LazyTensor(lambda: ir.tensor(np.concatenate([t.numpy() for t in tensors], axis=1)),
                         dtype=tensors[0].dtype, shape=shape)


class PackMatmuls(ir.passes.InPlacePass):
    """`pack_matmuls`."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        removed = pack_matmuls(model)
        logger.info("    packed MatMuls: %d fewer", removed)
        return ir.passes.PassResult(model, removed > 0)
