"""Weights read from the checkpoint when saved (`streaming.attach`) stay unread through the optimizer.

torch.onnx writes a linear layer's weight as `Transpose(W)`; constant folding would read W and keep the
transposed array in memory. Here a Transpose of a lazy weight becomes a lazy weight itself (transposed when
written), and the folding's `should_fold` leaves every other node on a lazy weight alone. A weight read elsewhere
too (a tied head's embedding) gets the same, streamed or not: constant folding leaves a large one's Transpose in
the graph, where the quantizer does not see a constant head; with this, both ways write the same graph.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

FOLDED_FROM = "pkg.onnxscript.optimizer.folded_from"


def is_lazy(value: ir.Value | None) -> bool:
    return value is not None and isinstance(value.const_value, ir.LazyTensor)


def reads_lazy(node: ir.Node) -> bool:
    return any(is_lazy(v) for v in node.inputs)


def _shared_initializer(value: ir.Value | None) -> bool:
    """A weight read elsewhere too (a tied head's embedding): constant folding leaves its Transpose when it is large."""
    return value is not None and value.is_initializer() and value.const_value is not None and len(value.uses()) > 1


def _transposed(tensor: ir.TensorProtocol, perm: list[int], name: str) -> ir.LazyTensor:
    def read():
        return ir.tensor(np.ascontiguousarray(np.transpose(tensor.numpy(), perm)))

    if hasattr(tensor, "transposed"):  # streaming.CheckpointTensor: written in blocks
        return tensor.transposed(perm, read, name)
    shape = ir.Shape([tensor.shape[p] for p in perm])
    return ir.LazyTensor(read, dtype=tensor.dtype, shape=shape, name=name)


def lazy_transposes(model: ir.Model) -> int:
    """Replace each Transpose of a lazy weight by a lazy transposed weight; return how many."""
    graph, count = model.graph, 0
    for node in list(graph):
        source = node.inputs[0] if node.op_type == "Transpose" and node.domain == "" and node.inputs else None
        if not (is_lazy(source) or _shared_initializer(source)) or source.is_graph_output():
            continue
        rank = len(source.const_value.shape)
        perm = list(node.attributes.get_ints("perm", list(range(rank))[::-1]))
        out = node.outputs[0]
        if out.is_graph_output():
            continue
        name, out.name = out.name, None  # the name constant folding would give it: the same graph
        value = ir.Value(name=name, const_value=_transposed(source.const_value, perm, name))
        value.shape, value.type = ir.Shape(value.const_value.shape), out.type or ir.TensorType(source.const_value.dtype)
        value.metadata_props[FOLDED_FROM] = str([source.name])  # as onnxscript's folding records it
        graph.register_initializer(value)
        out.replace_all_uses_with(value)
        graph.remove(node, safe=True)
        if not source.uses():  # a tied weight is also read as it is (the embedding's Gather)
            graph.initializers.pop(source.name, None)
        count += 1
    return count


class LazyTransposes(ir.passes.InPlacePass):
    """`lazy_transposes`."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        return ir.passes.PassResult(model, lazy_transposes(model) > 0)


def in_use_order(model: ir.Model) -> None:
    """Initializers in the order of their first reader (unread ones last): the saved file does not depend on
    when a pass registered them, so a streamed export writes the same bytes as one with the weights in memory."""
    graph = model.graph
    first: dict[str, int] = {}
    for index, node in enumerate(ir.traversal.RecursiveGraphIterator(graph)):
        for value in node.inputs:
            if value is not None and value.is_initializer():
                first.setdefault(value.name, index)
    ordered = sorted(graph.initializers.items(), key=lambda item: first.get(item[0], len(first) + 1 << 40))
    graph.initializers.clear()
    for _, value in ordered:
        graph.register_initializer(value)


class InitializersInUseOrder(ir.passes.InPlacePass):
    """`in_use_order`."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        in_use_order(model)
        return ir.passes.PassResult(model, False)
