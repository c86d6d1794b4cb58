"""Weight-only quantization of an exported graph (`--quantize int4|int8`): every MatMul with a constant weight
becomes onnxruntime's `MatMulNBits` (weights in blocks of `block_size` along the input axis, one scale per
block, symmetric), packed by onnxruntime's own block quantizer (`matmul_nbits_quantizer`, its C++ kernels).

What is quantized: the decoder's linear layers and, by default, the vocabulary projection (the MatMul whose
result becomes `logits`), as onnxruntime-genai's builder does. A constant MatMul narrower than one block is not
a linear layer (rotary embeddings multiply positions by their frequencies, K = 1) and keeps its precision. The
token embeddings (a Gather) stay in the export's dtype. `accuracy_level` 4 lets onnxruntime's CPU kernel multiply int8-quantized activations with the
weights (its fastest CPU path); the weights are what is stored in 4 or 8 bits either way.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir

from .group_query_attention import CONTRIB_DOMAIN

SCHEMES = {"int4": 4, "int8": 8}
_THROUGH = {"Add", "Mul", "Div", "Tanh", "Cast", "Reshape", "Identity", "Softcap", "Squeeze", "Unsqueeze"}


@dataclasses.dataclass(frozen=True)
class Scheme:
    """How weights are quantized (recorded in the manifest)."""

    bits: int
    block_size: int = 32
    symmetric: bool = True
    accuracy_level: int = 4
    head: bool = True  # the vocabulary projection too

    @classmethod
    def named(cls, name: str, **changes) -> Scheme:
        return cls(bits=SCHEMES[name], **changes)

    def record(self) -> dict:
        return {"method": "MatMulNBits (onnxruntime block quantization, round to nearest)",
                **dataclasses.asdict(self)}


def _constant_weight(node: ir.Node) -> np.ndarray | None:
    """The [K, N] weight of a MatMul on a constant (a [1, ..., 1, K, N] one squeezed), else None."""
    if node.op_type != "MatMul" or node.domain != "" or len(node.inputs) != 2 or node.inputs[0] is None:
        return None
    weight = node.inputs[1]
    if weight is None or weight.const_value is None or not weight.is_initializer() or weight.is_graph_output():
        return None
    shape = weight.const_value.shape
    if len(shape) < 2 or any(d != 1 for d in shape[:-2]):
        return None
    array = weight.const_value.numpy()
    if array.dtype not in (np.float32, np.float16):
        return None
    return np.ascontiguousarray(array.reshape(shape[-2], shape[-1]))  # the packer reads raw memory


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
    """MatMul(x, W) -> MatMulNBits(x, packed W, scales); each fp weight is released once replaced."""

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
            weight = _constant_weight(node)
            if weight is None or weight.shape[0] < scheme.block_size:  # not a linear layer (rotary frequencies)
                continue
            value = node.inputs[1]
            if node in heads and not scheme.head:
                self.kept.append(value.name)
                continue
            packed, scales, _ = quantizer.qbits_block_quant(weight)
            label = value.name
            inputs = [node.inputs[0], _initializer(graph, f"{label}_q{scheme.bits}", packed),
                      _initializer(graph, f"{label}_scales", scales)]
            k, n = weight.shape
            fused = ir.node("MatMulNBits", inputs, domain=CONTRIB_DOMAIN, name=f"{node.name or label}_q{scheme.bits}",
                            attributes={"K": k, "N": n, "bits": scheme.bits, "block_size": scheme.block_size,
                                        **({"accuracy_level": scheme.accuracy_level} if scheme.accuracy_level else {})})
            ir.convenience.replace_nodes_and_values(graph, node, [node], [fused], node.outputs, fused.outputs)
            if not value.uses():
                graph.initializers.pop(value.name, None)
                value.const_value = None
            self.quantized.append(label)
        if self.quantized:
            model.opset_imports.setdefault(CONTRIB_DOMAIN, 1)
        return ir.passes.PassResult(model, bool(self.quantized))


def _initializer(graph: ir.Graph, name: str, array: np.ndarray) -> ir.Value:
    value = ir.Value(name=name, const_value=ir.tensor(array, name=name))
    graph.register_initializer(value)
    return value


__all__ = ["SCHEMES", "QuantizeWeights", "Scheme", "head_matmuls"]
