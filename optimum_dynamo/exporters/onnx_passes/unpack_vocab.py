"""A weight with a very wide output (the vocabulary projection) is stored with a leading axis of 1.

onnxruntime prepacks 2D MatMul weights for its blocked SGEMM, which is slower for one row at a time than its
plain kernel on the weight as stored: measured on this project's machine, one token through a 512 x 32000
projection 2.6 -> 2.2 ms, 896 x 151936 25.8 -> 19.4 ms (1 thread). Weights of a decoder layer stay prepacked
(storing all of them so was slower). Same dot products, other kernel.
"""

from __future__ import annotations

import logging

import onnx_ir as ir

from .pack_matmuls import packable_weight

logger = logging.getLogger(__name__)

WIDE_OUTPUT = 16384  # output width from which a weight is left unpacked (vocabulary sizes)


def unpack_wide_weights(model: ir.Model) -> int:
    """Store constant [K, N] MatMul weights with N >= WIDE_OUTPUT as [1, K, N] (a batched MatMul that
    broadcasts: same result, not prepacked). Returns the number of weights changed."""
    changed = 0
    for node in model.graph:
        weight = packable_weight(node)
        rank = len(node.inputs[0].shape) if node.inputs[0] is not None and node.inputs[0].shape is not None else 0
        if weight is None or weight.shape[1] < WIDE_OUTPUT or rank < 3:  # [1, K, N] keeps a 3D+ result's shape
            continue
        value = node.inputs[1]

        def read(weight=weight):
            return ir.tensor(weight.numpy()[None])

        if hasattr(weight, "unsqueezed"):  # streaming.CheckpointTensor: still written and quantized in blocks
            value.const_value = weight.unsqueezed(read, value.name)
        else:
            value.const_value = ir.LazyTensor(read, dtype=weight.dtype, shape=ir.Shape([1, *weight.shape]),
                                              name=value.name)
        value.shape = ir.Shape(value.const_value.shape)
        changed += 1
    return changed


class UnpackVocab(ir.passes.InPlacePass):
    """`unpack_wide_weights`."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        changed = unpack_wide_weights(model)
        logger.info("    wide weights left unpacked: %d", changed)
        return ir.passes.PassResult(model, changed > 0)
