"""ONNX translations of aten ops torch.onnx's own table lacks, given to its `custom_translation_table`. Adding one
is writing a function of onnxscript ops (traced, as torch.onnx's own are) and decorating it with `translates`.

A translation of torch.onnx's that is wrong but cannot be replaced that way (an op on complex tensors: torch.onnx
registers custom translations for real inputs only) is mended in the translated graph by `amend`."""

from __future__ import annotations

from typing import Callable

import numpy as np
import onnx_ir as ir
import torch
from onnxscript import INT64
from onnxscript import opset18 as op

TABLE: dict[Callable, Callable] = {}


def translates(*targets) -> Callable:
    def register(function: Callable) -> Callable:
        for target in targets:
            TABLE[target] = function
        return function

    return register


@translates(torch.ops.aten.searchsorted.Tensor)
def searchsorted(sorted_sequence, self, out_int32: bool = False, right: bool = False, side: str | None = None,
                 sorter=None):
    """The insertion index of each value: how many entries of its row of `sorted_sequence` are below it (at or
    below with `right`). MusicFlamingo maps audio rows to clips with it."""
    if sorter is not None:
        raise NotImplementedError("searchsorted with a sorter")
    right = right or side == "right"
    if sorted_sequence.dtype != self.dtype:  # compared as torch promotes them (int64 counts, float boundaries)
        sorted_sequence, self = op.Cast(sorted_sequence, to=11), op.Cast(self, to=11)  # 11: double
    entries, values = op.Unsqueeze(sorted_sequence, [-2]), op.Unsqueeze(self, [-1])  # (..., 1, S), (..., V, 1)
    below = op.LessOrEqual(entries, values) if right else op.Less(entries, values)
    count = op.ReduceSum(op.Cast(below, to=INT64.dtype), [-1], keepdims=0)
    return op.Cast(count, to=6) if out_int32 else count  # 6: int32


def amend(model: ir.Model) -> int:
    """Mend the translated graph where torch.onnx's translation is wrong; returns the number of nodes mended."""
    return whole_spectrum_inverse_dfts(model)


def whole_spectrum_inverse_dfts(model: ir.Model) -> int:
    """torch.onnx translates irfft (`aten._fft_c2r`, onnxscript's torchlib: torch 2.13 to 2.15 at least) to one
    DFT with inverse=1, onesided=1: m bins of a one-sided spectrum in, n = dft_length real values out. Where n is
    not a constant (any dynamic length), ONNX's shape inference gives that output the input's length m on its axis,
    and onnxruntime's memory planner then hands it the buffer of a freed m-long value: "Shape mismatch attempting to
    re-use buffer. {2,32,10,1} != {2,32,18,1}" (MEGA's EMA, irfft(rfft(x, n=2L) * rfft(k, n=2L), n=2L)).
    Each such DFT becomes the complex inverse DFT of the whole spectrum, whose length (n, made explicit) ONNX infers
    right: the first h = n//2 + 1 bins (cut or zero-padded to h), then bins n-h..1 conjugated; its real part is
    irfft's signal (the imaginary parts of bins 0 and n/2 do not reach it, as irfft ignores them)."""
    graph = model.graph
    if graph.opset_imports.get("", 0) < 18:  # Pad's axes
        return 0
    mended = 0
    for node in list(ir.traversal.RecursiveGraphIterator(graph)):
        if node.op_type != "DFT" or node.domain != "" or node.attributes.get_int("inverse", 0) != 1 \
                or node.attributes.get_int("onesided", 0) != 1:
            continue
        inputs = list(node.inputs) + [None] * (3 - len(node.inputs))
        x, length, axis_input = inputs
        if "axis" in node.attributes:  # DFT-17
            axis = node.attributes.get_int("axis")
        elif axis_input is None:
            axis = -2
        elif (constant := ir.convenience.get_const_tensor(axis_input)) is not None:
            axis = int(constant.numpy().reshape(-1)[0])
        else:
            continue
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
        signal = tape.op("DFT", [whole, None, *inputs[2:len(node.inputs)]], attributes=attributes)
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
        mended += 1
    return mended


__all__ = ["TABLE", "amend", "searchsorted", "translates", "whole_spectrum_inverse_dfts"]
