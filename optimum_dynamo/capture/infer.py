"""From recorded calls to torch.export arguments: one sample, dynamic axes, axis names.

- An axis is dynamic when its size differs between calls.
- The sample is a recorded call in which every dynamic axis is >= 2 (sizes 0 and 1 make
  torch.export specialize), so no axis is fixed to a sample size.
- Axes whose sizes are equal in every call share a name; an axis whose size is the sum of two
  named axes in every call is named after the sum ("past_sequence_length + sequence_length").
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from ..flatten import flat_inputs, input_name, is_cache
from .observer import Call

# Names for well-known axes (flat input name prefix, axis) -> name; the first match names a group.
KNOWN_AXES: list[tuple[str, int, str]] = [
    ("input_ids", 0, "batch_size"),
    ("input_ids", 1, "sequence_length"),
    ("inputs_embeds", 0, "batch_size"),
    ("inputs_embeds", 1, "sequence_length"),
    ("pixel_values", 0, "batch_size"),
    ("past_key_values.", -2, "past_sequence_length"),
    ("attention_mask", 0, "batch_size"),
]


class CaptureError(ValueError):
    pass


@dataclass
class ExportArguments:
    kwargs: dict[str, Any]  # the sample passed to torch.export
    dynamic_shapes: dict[str, Any]  # same structure as kwargs
    input_names: list[str]  # flat names, in graph order
    axis_names: dict[str, dict[int, str]]  # flat name -> axis -> symbolic name
    sample_call: int  # index of the call used as the sample
    shapes: dict[str, list[tuple[int, ...]]] = field(default_factory=dict)  # every recorded shape


def _ordered_union(dicts: list[dict[str, Any]], order: Sequence[str]) -> list[str]:
    seen: dict[str, None] = {}
    for kwarg in order:
        for d in sorted(dicts, key=len, reverse=True):
            for name in d:
                if name == kwarg or name.startswith(kwarg + "."):
                    seen.setdefault(name)
    return list(seen)


def _dynamic_axes(shapes: list[tuple[int, ...]], name: str) -> set[int]:
    ranks = {len(s) for s in shapes}
    if len(ranks) > 1:
        raise CaptureError(f"input {name!r} changes rank between calls: {sorted(set(shapes))}")
    return {axis for axis in range(ranks.pop()) if len({s[axis] for s in shapes}) > 1}


def _axis_sizes(flats, name, axis) -> list[int | None]:
    return [f[name].shape[axis] if name in f else None for f in flats]


def _same(a: list[int | None], b: list[int | None]) -> bool:
    both = [(x, y) for x, y in zip(a, b) if x is not None and y is not None]
    return bool(both) and all(x == y for x, y in both)


def name_axes(flats: list[dict[str, torch.Tensor]], dynamic: dict[str, set[int]]) -> dict[str, dict[int, str]]:
    keys = [(name, axis) for name, axes in dynamic.items() for axis in sorted(axes)]
    sizes = {key: _axis_sizes(flats, *key) for key in keys}
    groups: list[list[tuple[str, int]]] = []
    for key in keys:
        group = next((g for g in groups if _same(sizes[g[0]], sizes[key])), None)
        group.append(key) if group is not None else groups.append([key])

    ranks = {name: next(f[name].dim() for f in flats if name in f) for name in dynamic}

    def known(group) -> str | None:
        for prefix, axis, label in KNOWN_AXES:
            for name, ax in group:
                matches = name == prefix or (prefix.endswith(".") and name.startswith(prefix))
                if matches and ax == axis % ranks[name]:
                    return label
        return None

    labels = {id(g): known(g) for g in groups}
    named = [g for g in groups if labels[id(g)]]
    for group in groups:
        if labels[id(group)]:
            continue
        for a, b in itertools.combinations(named, 2):
            total = [
                x + y if x is not None and y is not None else None
                for x, y in zip(sizes[a[0]], sizes[b[0]])
            ]
            if _same(total, sizes[group[0]]) and sum(v is not None for v in total) >= 2:
                first, second = sorted([labels[id(a)], labels[id(b)]], key=lambda s: s != "past_sequence_length")
                labels[id(group)] = f"{first} + {second}"
                break
        else:
            name, axis = group[0]
            labels[id(group)] = f"{name}_dim_{axis}"
    return {
        name: {axis: labels[id(g)] for g in groups for n, axis in g if n == name}
        for name in dynamic
        if dynamic[name]
    }


def infer_arguments(
    calls: Sequence[Call], inputs: Sequence[str], constants: dict[str, Any] | None = None
) -> ExportArguments:
    """Export arguments for the kwargs `inputs` (in graph order), plus fixed `constants`."""
    if not calls:
        raise CaptureError("no forward call was recorded: nothing to infer the export inputs from")
    present = [n for n in inputs if any(c.kwargs.get(n) is not None for c in calls)]
    flats = [flat_inputs(c.kwargs, present) for c in calls]
    names = _ordered_union(flats, present)
    shapes = {n: [tuple(f[n].shape) for f in flats if n in f] for n in names}
    dynamic = {n: _dynamic_axes(shapes[n], n) for n in names}

    def smallest_dynamic(i: int) -> float:
        sizes = [flats[i][n].shape[a] for n in names for a in dynamic[n]]
        return min(sizes, default=float("inf"))

    complete = [i for i, f in enumerate(flats) if set(f) == set(names)]
    if not complete:
        raise CaptureError(f"no recorded call has all of the inputs {names}")
    best = max(complete, key=lambda i: (smallest_dynamic(i), i))
    if smallest_dynamic(best) < 2:
        raise CaptureError(
            "no recorded call has every varying axis >= 2 (sizes 0 and 1 would be fixed in the graph); "
            "drive the model with longer or more varied inputs"
        )
    sample = calls[best].kwargs
    kwargs = {n: sample[n] for n in present}
    dynamic_shapes: dict[str, Any] = {}
    for n in present:
        if is_cache(sample[n]):
            leaves = [k for k in names if k.startswith(input_name(n, ""))]
            dynamic_shapes[n] = [{a: torch.export.Dim.DYNAMIC for a in sorted(dynamic[k])} for k in leaves]
        else:
            dynamic_shapes[n] = {a: torch.export.Dim.DYNAMIC for a in sorted(dynamic[n])} or None
    kwargs.update(constants or {})
    dynamic_shapes.update({k: None for k in constants or {}})
    return ExportArguments(kwargs, dynamic_shapes, names, name_axes(flats, dynamic), best, shapes)
