"""irfft with a dynamic length, as onnxruntime runs it.

torch.onnx translates irfft (`aten._fft_c2r`, onnxscript's torchlib: torch 2.13 to 2.15 at least) to one
DFT with inverse=1, onesided=1: m bins of a one-sided spectrum in, n = dft_length real values out. Where n is
not a constant (any dynamic length), ONNX's shape inference gives that output the input's length m on its axis,
and onnxruntime's memory planner then hands it the buffer of a freed m-long value: "Shape mismatch attempting to
re-use buffer. {2,32,10,1} != {2,32,18,1}" (MEGA's EMA, irfft(rfft(x, n=2L) * rfft(k, n=2L), n=2L)).
Each such DFT becomes the complex inverse DFT of the whole spectrum, whose length (n, made explicit) ONNX infers
right: the first h = n//2 + 1 bins (cut or zero-padded to h), then bins n-h..1 conjugated; its real part is
irfft's signal (the imaginary parts of bins 0 and n/2 do not reach it, as irfft ignores them).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir


def _axis(node: ir.Node) -> int | None:
    """The DFT's axis: an attribute (DFT-17), else its third input where constant (DFT-20), else -2."""
    if "axis" in node.attributes:
        return node.attributes.get_int("axis")
    if len(node.inputs) < 3 or node.inputs[2] is None:
        return -2
    constant = ir.convenience.get_const_tensor(node.inputs[2])
    return None if constant is None else int(constant.numpy().reshape(-1)[0])


def _whole_spectrum(node: ir.Node, axis: int) -> None:
    """Replace `node` (a one-sided inverse DFT) by the inverse DFT of the whole spectrum and its real part."""
    x, length = node.inputs[0], node.inputs[1] if len(node.inputs) > 1 else None
    tape = ir.tape.Tape(graph_like=node.graph)

    def ints(*values):
        return tape.op("Constant", [], {"value": ir.tensor(np.array(values, dtype=np.int64))})

    axes = ints(axis)
    bins = tape.op("Shape", [x], {"start": axis, "end": axis + 1})  # m (axis is never the last one)
    if length is None:  # IRFFT's default: 2 (m - 1)
        n = tape.op("Mul", [tape.op("Sub", [bins, ints(1)]), ints(2)])
    else:
        n = tape.op("Reshape", [tape.op("Cast", [length], {"to": ir.DataType.INT64}), ints(1)])
    h = tape.op("Add", [tape.op("Div", [n, ints(2)]), ints(1)])
    missing = tape.op("Max", [tape.op("Sub", [h, bins]), ints(0)])
    half = tape.op("Pad", [tape.op("Slice", [x, ints(0), h, axes]), tape.op("Concat", [ints(0), missing],
                                                                              {"axis": 0}), None, axes])
    mirrored = tape.op("Slice", [half, tape.op("Sub", [n, h]), ints(0), axes, ints(-1)])  # bins n-h..1
    conjugate = tape.op("CastLike", [tape.op("Constant", [], {"value": ir.tensor(np.array([1.0, -1.0]))}), x])
    whole = tape.op("Concat", [half, tape.op("Mul", [mirrored, conjugate])], {"axis": axis})
    attributes = {**{a.name: a for a in node.attributes.values()}, "onesided": ir.AttrInt64("onesided", 0)}
    signal = tape.op("DFT", [whole, None, *node.inputs[2:]], attributes=attributes)
    real = tape.op("Slice", [signal, ints(0), ints(1), ints(-1)])
    node.graph.insert_before(node, tape.nodes)
    old = node.outputs[0]
    if old.dtype is not None:
        real.dtype = old.dtype  # (not its shape: the wrong one, where it has one)
    if old.is_graph_output():
        name, old.name = old.name, None
        real.name = name
    old.replace_all_uses_with(real, replace_graph_outputs=True)
    node.graph.remove(node, safe=True)


class WholeSpectrumInverseDFT(ir.passes.InPlacePass):
    def call(self, model: ir.Model) -> ir.passes.PassResult:
        if model.graph.opset_imports.get("", 0) < 18:  # Pad's axes
            return ir.passes.PassResult(model, False)
        mended = 0
        for node in list(ir.traversal.RecursiveGraphIterator(model.graph)):
            if node.op_type != "DFT" or node.domain != "" or node.attributes.get_int("inverse", 0) != 1 \
                    or node.attributes.get_int("onesided", 0) != 1 or (axis := _axis(node)) is None:
                continue
            _whole_spectrum(node, axis)
            mended += 1
        return ir.passes.PassResult(model, mended > 0)
