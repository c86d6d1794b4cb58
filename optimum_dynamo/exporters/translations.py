"""ONNX translations of aten ops torch.onnx's own table lacks, given to its `custom_translation_table`. Adding one
is writing a function of onnxscript ops (traced, as torch.onnx's own are) and decorating it with `translates`.
(A translation of an op on complex tensors cannot be replaced here, torch.onnx takes custom ones for real inputs
only: the translated graph is mended instead, `onnx_passes.inverse_dft`.)"""

from __future__ import annotations

from typing import Callable

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


@translates(torch.ops.aten.remainder.Scalar)
def remainder_scalar(self, other):
    """Python's remainder (the divisor's sign) by a scalar that may be a size: torch.onnx's own makes a constant of
    it, which fails on a symbolic one. transformers 4's older sequence classifiers (open-llama) find each row's last
    token as `(first pad - 1) % input_ids.shape[-1]`."""
    other = op.CastLike(other, self)
    if self.dtype.is_integer():
        return op.Mod(self, other)  # fmod=0: the divisor's sign
    return op.Sub(self, op.Mul(op.Floor(op.Div(self, other)), other))


@translates(torch.ops.aten._adaptive_avg_pool2d.default, torch.ops.aten.adaptive_avg_pool2d.default)
def adaptive_avg_pool2d(self, output_size):
    """The mean of each of `output_size` bins of the last two axes, bin `i` of `n` over a length `L` spanning
    `floor(i L / n)` to `ceil((i + 1) L / n)`, for a length known only at run time: torch's decomposition gathers
    windows whose widths it computes at the traced size, which index past the input at others (UperNet's pyramid
    pooling). Each axis in turn: differences of a cumulative sum at the bins' ends, over their widths."""
    pooled = self
    for axis, bins in zip((-2, -1), output_size):
        pooled = _bin_means(pooled, axis, bins)
    return pooled


def _bin_means(x, axis: int, bins: int):
    if bins == 1:  # a global pool (ResNet's head)
        return op.ReduceMean(x, [axis], keepdims=1)
    length = op.Shape(x, start=axis, end=axis + 1 if axis < -1 else None)
    index = op.Range(op.Constant(value_int=0), op.Constant(value_int=bins), op.Constant(value_int=1))
    index = op.Unsqueeze(index, [0])  # (1, bins): broadcast against the length (1,)
    starts = op.Div(op.Mul(index, length), bins)
    ends = op.Div(op.Add(op.Mul(op.Add(index, 1), length), bins - 1), bins)
    starts, ends = op.Reshape(starts, [-1]), op.Reshape(ends, [-1])
    zero = op.Mul(op.Slice(x, [0], [1], [axis]), op.CastLike(0, x))
    totals = op.Concat(zero, op.CumSum(x, op.Constant(value_int=axis)), axis=axis)
    sums = op.Sub(op.Gather(totals, ends, axis=axis), op.Gather(totals, starts, axis=axis))
    widths = op.CastLike(op.Sub(ends, starts), x)
    return op.Div(sums, op.Unsqueeze(widths, [1]) if axis == -2 else widths)


__all__ = ["TABLE", "adaptive_avg_pool2d", "remainder_scalar", "searchsorted", "translates"]
