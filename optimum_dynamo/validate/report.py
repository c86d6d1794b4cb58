"""Discrepancies between onnxruntime and the PyTorch outputs recorded during capture."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from ..capture import Call, ExportArguments
import torch.utils._pytree as pytree

from ..flatten import flat_inputs, flat_outputs, input_name, is_cache
from .piecewise import run_cases


@dataclass
class Discrepancy:
    output: str
    max_abs: float
    max_rel: float
    worst_call: int
    calls: int
    magnitude: float = 0.0  # the largest |PyTorch value| compared


Fill = Callable[[dict[str, int]], torch.Tensor]


def substitute_missing(
    flat: dict[str, torch.Tensor], args: ExportArguments, fill: dict[str, Fill] | None = None
) -> dict[str, torch.Tensor]:
    """Fill inputs absent from a call (an empty cache on the first step): zeros shaped like the
    sample, each named axis taking its size from the call's present inputs, other varying axes 0.
    `fill[name](sizes)` overrides one input: it gets the call's named axis sizes, returns the tensor."""
    sizes = {
        label: flat[name].shape[axis]
        for name, axes in args.axis_names.items()
        if name in flat
        for axis, label in axes.items()
    }
    sample = flat_inputs(args.kwargs, list(args.kwargs))
    filled = dict(flat)
    for name in args.input_names:
        if name in flat:
            continue
        if fill and name in fill:
            filled[name] = fill[name](sizes)
        else:
            shape = list(sample[name].shape)
            for axis, label in args.axis_names.get(name, {}).items():
                shape[axis] = sizes.get(label, 0)
            filled[name] = torch.zeros(shape, dtype=sample[name].dtype)
    return filled


def rebuild_kwargs(flat: dict[str, torch.Tensor], args: ExportArguments) -> dict:
    """Forward kwargs from flat tensors: caches rebuilt with the sample's tree structure."""
    kwargs = {}
    for name, value in args.kwargs.items():
        if isinstance(value, torch.Tensor):
            kwargs[name] = flat[name]
        elif is_cache(value):
            leaves = [flat[n] for n in args.input_names if n.startswith(input_name(name, ""))]
            kwargs[name] = pytree.tree_unflatten(leaves, pytree.tree_structure(value))
        else:
            kwargs[name] = value
    return kwargs


def _align(got: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """Recorded outputs may keep only the last positions (generate's logits_to_keep=1)."""
    if got.shape == expected.shape or got.ndim != expected.ndim:
        return got
    index = tuple(slice(g - e, None) if e < g else slice(None) for g, e in zip(got.shape, expected.shape))
    return got[index]


def position_axes(session) -> dict[str, int]:
    """Output axes that index token positions (their dim name mentions sequence_length)."""
    return {
        out.name: axis
        for out in session.get_outputs()
        for axis, dim in enumerate(out.shape)
        if axis > 0 and isinstance(dim, str) and "sequence_length" in dim
    }


def token_axis(name: str, shape: tuple[int, ...], positions: dict[str, int], feed: dict[str, torch.Tensor]) -> int | None:
    """The output axis that indexes the input tokens: named so (`position_axes`), else a cache's positions (axis 2
    of `present.*`), else axis 1 when it has the batch and length of `input_ids` (an output whose sequence axis got
    no name still skips padding)."""
    if name in positions:
        return positions[name]
    if name.startswith("present.") and len(shape) == 4:  # a cache (batch, heads, positions, head size)
        return 2
    ids = feed.get("input_ids")
    if ids is not None and ids.dim() == 2 and len(shape) >= 2 and tuple(shape[:2]) == tuple(ids.shape):
        return 1
    return None


def _unmasked(mask: torch.Tensor | None, shape: tuple[int, ...], axis: int | None) -> np.ndarray | None:
    """Where the attention mask (right-aligned on `axis`) is 1; padding positions are not compared."""
    if mask is None or axis is None or mask.dim() != 2 or mask.shape[1] < shape[axis]:
        return None
    keep = mask[:, mask.shape[1] - shape[axis] :].bool().numpy()
    view = [shape[0] if i == 0 else shape[axis] if i == axis else 1 for i in range(len(shape))]
    return np.broadcast_to(keep.reshape(view), shape)


def references(calls: Sequence[Call], args: ExportArguments, model, fill: dict[str, Fill] | None = None
               ) -> list[tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]]:
    """PyTorch's side of the comparison, per recorded call: the flat inputs fed to the runtime and the outputs
    expected — the recorded ones, or `model` run again on the same inputs when some were substituted. Made
    before the runtime's session, so that the model's weights can be released in between."""
    kwarg_names = [k for k in args.kwargs if any(n == k or n.startswith(input_name(k, "")) for n in args.input_names)]
    found = []
    for call in calls:
        flat = flat_inputs(call.kwargs, kwarg_names)
        feed = substitute_missing(flat, args, fill)
        if len(feed) > len(flat):  # on copies: a model may change its inputs in place (XGLM's position ids on 4.x)
            with torch.no_grad():
                expected = flat_outputs(model(**rebuild_kwargs({k: v.clone() for k, v in feed.items()}, args)))
        else:
            expected = flat_outputs(call.outputs)
        found.append((feed, expected))
    return found


def compare(session, cases: Sequence[tuple[dict, dict]], args: ExportArguments, output_names: list[str]
            ) -> list[Discrepancy]:
    """Run `session` on every case (`references`) and compare each output with PyTorch's. Positions hidden
    by the attention mask are left out (padding computes different garbage in each runtime)."""
    positions = position_axes(session)
    worst: dict[str, Discrepancy] = {}
    feeds = [{n: feed[n].numpy() for n in args.input_names} for feed, _ in cases]
    for i, ((feed, expected), results) in enumerate(zip(cases, run_cases(session, feeds))):
        for name, got in zip(output_names, results):
            if name not in expected:
                continue
            ref = expected[name].float().numpy()
            got = _align(got, ref).astype(np.float32)
            if got.shape != ref.shape:
                continue
            diff = np.abs(got - ref)
            keep = _unmasked(feed.get("attention_mask"), got.shape, token_axis(name, got.shape, positions, feed))
            if keep is not None:
                diff, ref = diff[keep], ref[keep]
            diff = np.nan_to_num(diff, nan=np.inf)  # a NaN on either side is the worst difference
            abs_err = float(diff.max(initial=0.0))
            rel_err = float((diff / (np.abs(ref) + 1e-6)).max(initial=0.0))
            row = worst.setdefault(name, Discrepancy(name, 0.0, 0.0, i, 0))
            row.calls += 1
            row.max_rel = max(row.max_rel, rel_err)
            row.magnitude = max(row.magnitude, float(np.abs(ref[np.isfinite(ref)]).max(initial=0.0)))
            if abs_err >= row.max_abs:
                row.max_abs, row.worst_call = abs_err, i
    return [worst[n] for n in output_names if n in worst]


def table(rows: Sequence[Discrepancy]) -> str:
    lines = [f"{'output':<28} {'max abs':>10} {'max rel':>10} {'calls':>6}"]
    lines += [f"{r.output:<28} {r.max_abs:>10.2e} {r.max_rel:>10.2e} {r.calls:>6}" for r in rows]
    return "\n".join(lines)


def as_dicts(rows: Sequence[Discrepancy]) -> list[dict]:
    return [asdict(r) for r in rows]
