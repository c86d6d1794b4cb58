"""The torchscript fallback's graph, checked on the dynamo attempt's captured calls.

optimum's exporter runs here without its own validation (its dummy inputs are not the pipeline's), and a graph it
traces can be wrong where `--dynamo`'s was (metaclip_2's text pooling: logits 5.0 off). Where the attempt got past
capture of one graph without a cache, the task's runtime class runs the fallback's graph on those calls: an
output grossly off PyTorch's recorded one fails the fallback, so nothing is written."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from ..errors import ExportError, describe
from .gate import GROSS_ABOVE, factor

logger = logging.getLogger(__name__)


class FallbackMismatch(ExportError):
    """The fallback's graph is grossly off PyTorch on the captured inputs."""


def worst_difference(model, calls) -> tuple[float, str, float]:
    """(|runtime - PyTorch| furthest beyond its threshold, output name, that threshold's factor: `gate.factor`) over
    the calls' tensor outputs the runtime also returns."""
    worst, where, worst_factor = 0.0, "", 1.0
    for call in calls:
        feed = {k: v for k, v in call.kwargs.items() if isinstance(v, torch.Tensor) and k in model.input_names}
        got = model(**feed)
        for name, expected in dict(call.outputs).items():
            value = got.get(name) if hasattr(got, "get") else None
            if not isinstance(expected, torch.Tensor) or value is None:
                continue
            value = torch.as_tensor(value)
            if value.shape != expected.shape:
                return float("inf"), f"{name} (shape {tuple(value.shape)}, PyTorch {tuple(expected.shape)})", 1.0
            if not value.numel():
                continue
            difference = (value.float() - expected.float()).abs().nan_to_num(nan=float("inf")).max().item()
            finite = expected.float()[expected.float().isfinite()]
            scale = factor(finite.abs().max().item() if finite.numel() else 0.0)
            if difference / scale > worst / worst_factor:
                worst, where, worst_factor = difference, name, scale
    return worst, where, worst_factor


def check_fallback(directory: Path, ctx, dtype: str | None) -> None:
    """Raise FallbackMismatch when the fallback's graph in `directory` is grossly off the attempt's captured outputs."""
    if ctx is None or ctx.observer is None or ctx.task is None or ctx.task.with_past or len(ctx.components) != 1:
        return  # nothing captured, or graphs this check does not cover (caches, encoder-decoders)
    try:
        model = ctx.task.runtime_class().from_pretrained(directory)
        worst, where, scale = worst_difference(model, ctx.observer.calls)
    except Exception as e:
        if "while running" in str(e):  # a node of the graph fails on the task's own inputs: a wrong graph
            raise FallbackMismatch(f"the torchscript fallback's graph fails on the captured inputs ({describe(e)}): "
                                   "the graph is wrong, nothing written") from None
        # the captured calls do not fit its inputs: say so, keep optimum's result
        logger.warning("    the torchscript graph was not checked on the captured calls (%s)", describe(e))
        return
    limit = GROSS_ABOVE["fp32" if dtype in (None, "fp32") else "fp16"] * scale
    if worst > limit:
        raise FallbackMismatch(f"the torchscript fallback's graph differs from PyTorch by {worst:.3g} > {limit:g} on the "
                          f"captured inputs ({where}): the graph is wrong, nothing written")
    logger.info("    torchscript graph vs PyTorch on %d captured calls: max abs %.2e", len(ctx.observer.calls), worst)
