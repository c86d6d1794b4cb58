"""Weight-only quantization of an exported graph (`--quantize int4|int8`): every MatMul with a constant weight
becomes onnxruntime's `MatMulNBits` (weights in blocks of `block_size` along the input axis, one scale per
block, symmetric), packed by onnxruntime's own block quantizer (`matmul_nbits_quantizer`, its C++ kernels).

What is quantized: the decoder's linear layers and, by default, the vocabulary projection (the MatMul whose
result becomes `logits`), as onnxruntime-genai's builder does. A constant MatMul narrower than one block is not
a linear layer (rotary embeddings multiply positions by their frequencies, K = 1) and keeps its precision. The
token embeddings (a Gather) stay in the export's dtype unless asked (`embeddings`: 4 bits, onnxruntime's
`GatherBlockQuantized`, packed by the same quantizer's `quantize_gather`). `accuracy_level` 4 lets onnxruntime's CPU kernel multiply int8-quantized activations with the
weights (its fastest CPU path); the weights are what is stored in 4 or 8 bits either way.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir

from . import CONTRIB_DOMAIN

_FLOATS = (ir.DataType.FLOAT, ir.DataType.FLOAT16)
_COLUMNS = 4096  # output columns quantized at a time
SCHEMES = {"int4": 4, "int8": 8}
_THROUGH = {"Add", "Mul", "Div", "Tanh", "Cast", "Reshape", "Identity", "Squeeze", "Unsqueeze"}


@dataclasses.dataclass(frozen=True)
class Scheme:
    """How weights are quantized (recorded in the manifest)."""

    bits: int
    block_size: int = 32
    symmetric: bool = True
    accuracy_level: int = 4
    head: bool = True  # the vocabulary projection too
    embeddings: bool = False  # the token embeddings too (4 bits only: onnxruntime's GatherBlockQuantized)

    @classmethod
    def named(cls, name: str, **changes) -> Scheme:
        return cls(bits=SCHEMES[name], **changes)

    def record(self) -> dict:
        return {"method": "MatMulNBits (onnxruntime block quantization, round to nearest)",
                **dataclasses.asdict(self)}


def _constant_weight(node: ir.Node) -> tuple[ir.TensorProtocol, int, int] | None:
    """(tensor, K, N) of a MatMul on a constant [K, N] (or [1, ..., 1, K, N]) float weight, else None."""
    if node.op_type != "MatMul" or node.domain != "" or len(node.inputs) != 2 or node.inputs[0] is None:
        return None
    weight = node.inputs[1]
    if weight is None or weight.const_value is None or not weight.is_initializer() or weight.is_graph_output():
        return None
    tensor = weight.const_value
    shape = tensor.shape
    if len(shape) < 2 or any(d != 1 for d in shape[:-2]) or tensor.dtype not in _FLOATS:
        return None
    return tensor, shape[-2], shape[-1]


class _Blocks:
    """One weight's block quantization, made when its packed weights or scales are first read (the save stage
    writes them one at a time) and dropped once both were read: the quantized weights are never all in memory
    beside the fp32 ones."""

    def __init__(self, tensor: ir.TensorProtocol, quantizer):
        self._tensor, self._quantizer, self._made, self._left = tensor, quantizer, None, set()

    def part(self, index: int) -> ir.Tensor:
        if self._made is None:
            # blocks run along K, so columns quantize independently: a few at a time, each copied contiguous
            # (the packer reads raw memory; folded weights are transposed views) -- no full-size copy at once;
            # a weight streamed from the checkpoint reads each block alone (`streaming.CheckpointTensor`)
            reader = getattr(self._tensor, "column_blocks", None)
            columns = reader(_COLUMNS) if reader else None
            if columns is None:
                k, n = self._tensor.shape[-2:]
                weight = self._tensor.numpy().reshape(k, n)
                columns = (weight[:, i:i + _COLUMNS] for i in range(0, n, _COLUMNS))
            parts = [self._quantizer.qbits_block_quant(np.ascontiguousarray(block))[:2] for block in columns]
            self._made, self._left = tuple(np.concatenate(p, axis=0) for p in zip(*parts)), {0, 1}
        array = self._made[index]
        self._left.discard(index)
        if not self._left:
            self._made = None
        return ir.tensor(array)


def head_matmuls(graph: ir.Graph) -> set[ir.Node]:
    """MatMuls whose result reaches the `logits` output through elementwise ops only (softcapping, scaling)."""
    found = set()
    for output in graph.outputs:
        if output.name != "logits":
            continue
        node = output.producer()
        while node is not None and node.op_type in _THROUGH:
            data = [v for v in node.inputs if v is not None and v.const_value is None]
            node = data[0].producer() if len(data) == 1 else None
        if node is not None and node.op_type == "MatMul":
            found.add(node)
    return found


class QuantizeWeights(ir.passes.InPlacePass):
    """MatMul(x, W) -> MatMulNBits(x, packed W, scales), and with `scheme.embeddings` Gather(E, ids) ->
    GatherBlockQuantized; each fp weight is released once replaced."""

    def __init__(self, scheme: Scheme):
        super().__init__()
        self.scheme = scheme
        self.quantized: list[str] = []
        self.kept: list[str] = []

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        from onnxruntime.quantization.matmul_nbits_quantizer import (
            DefaultWeightOnlyQuantConfig,
            DefaultWeightOnlyQuantizer,
        )

        scheme, graph = self.scheme, model.graph
        quantizer = DefaultWeightOnlyQuantizer(DefaultWeightOnlyQuantConfig(
            block_size=scheme.block_size, is_symmetric=scheme.symmetric, accuracy_level=scheme.accuracy_level,
            bits=scheme.bits))
        heads = head_matmuls(graph)
        for node in list(graph):
            if node.op_type == "Gather" and node.domain == "" and scheme.embeddings:
                replaced = _gather(node, quantizer)
            else:
                weight = _constant_weight(node)
                if weight is None or weight[1] < scheme.block_size:  # not a linear layer (rotary frequencies)
                    continue
                if node in heads and not scheme.head:
                    self.kept.append(node.inputs[1].name)
                    continue
                replaced = _matmul(node, *weight, quantizer, scheme)
            if replaced is None:
                continue
            value = node.inputs[0 if node.op_type == "Gather" else 1]
            for value_made in replaced.inputs:
                if value_made is not None and value_made.const_value is not None and not value_made.is_initializer():
                    graph.register_initializer(value_made)
            ir.convenience.replace_nodes_and_values(graph, node, [node], [replaced], node.outputs, replaced.outputs)
            if not value.uses():
                graph.initializers.pop(value.name, None)
                value.const_value = None  # memory: the removed value may outlive the graph
            self.quantized.append(value.name)
        if self.quantized:
            model.opset_imports.setdefault(CONTRIB_DOMAIN, 1)
        return ir.passes.PassResult(model, bool(self.quantized))


def _matmul(node: ir.Node, tensor: ir.TensorProtocol, k: int, n: int, quantizer, scheme: Scheme) -> ir.Node:
    blocks, label = _Blocks(tensor, quantizer), node.inputs[1].name
    k_blocks = -(-k // scheme.block_size)
    packed = ir.LazyTensor(lambda: blocks.part(0), dtype=ir.DataType.UINT8,
                           shape=ir.Shape([n, k_blocks, scheme.block_size * scheme.bits // 8]))
    scales = ir.LazyTensor(lambda: blocks.part(1), dtype=tensor.dtype, shape=ir.Shape([n, k_blocks]))
    return ir.node("MatMulNBits", [node.inputs[0], _constant(f"{label}_q{scheme.bits}", packed),
                                   _constant(f"{label}_scales", scales)],
                   domain=CONTRIB_DOMAIN, name=f"{node.name or label}_q{scheme.bits}",
                   attributes={"K": k, "N": n, "bits": scheme.bits, "block_size": scheme.block_size,
                               **({"accuracy_level": scheme.accuracy_level} if scheme.accuracy_level else {})})


def _gather(node: ir.Node, quantizer) -> ir.Node | None:
    """A lookup in a constant [vocab, hidden] table -> GatherBlockQuantized (4 bits, blocks along hidden), made
    by onnxruntime's own `quantize_gather` on a one-node graph of it."""
    import onnx

    table = node.inputs[0]
    if table is None or table.const_value is None or not table.is_initializer() or len(table.const_value.shape) != 2:
        return None
    if node.attributes.get_int("axis", 0) != 0 or table.const_value.dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16):
        return None
    data = onnx.numpy_helper.from_array(np.ascontiguousarray(table.const_value.numpy()), table.name)
    proto = onnx.helper.make_graph([onnx.helper.make_node("Gather", [table.name, "ids"], ["out"])], "gather", [], [],
                                   [data])
    with np.errstate(divide="ignore", invalid="ignore"):  # an all-zero block (padding row) has scale 0: kept 0
        (made,) = quantizer.quantize_gather(proto.node[0], [proto])
    constants = {t.name: _constant(t.name, ir.serde.deserialize_tensor(t)) for t in proto.initializer
                 if t.name != table.name}
    inputs = [node.inputs[1] if name == "ids" else constants[name] for name in made.input]
    return ir.node("GatherBlockQuantized", inputs, domain=CONTRIB_DOMAIN, name=f"{node.name or table.name}_q4",
                   attributes={a.name: onnx.helper.get_attribute_value(a) for a in made.attribute})


def _constant(name: str, array) -> ir.Value:
    return ir.Value(name=name, const_value=ir.tensor(array, name=name) if isinstance(array, np.ndarray) else array)


__all__ = ["SCHEMES", "QuantizeWeights", "Scheme", "head_matmuls"]
