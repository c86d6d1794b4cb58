"""From recorded calls to torch.export arguments: one sample, dynamic axes, axis names.

- An axis is dynamic when its size differs between calls.
- The sample is a recorded call in which every dynamic axis is >= 2 (sizes 0 and 1 make
  torch.export specialize), so no axis is fixed to a sample size. When no call qualifies (one
  `generate` or a pipeline: prefill has no cache, decode steps one token), the call with the most
  such axes is grown: each short axis is extended to 2 by repeating its last slice (zeros if empty),
  and an axis named "A + B" by the growth of A and B, so the sizes stay consistent.
- Batch axes (axis 0 of every input whose axis 0 follows the first input's) are dynamic even when
  every call had the same batch.
- Axes whose sizes are equal in every call share a name; an axis whose size is the sum of two
  named axes in every call is named after the sum ("past_sequence_length + sequence_length").
"""

from __future__ import annotations

import fnmatch
import itertools
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from ..flatten import bounded_inputs, flat_inputs, flatten_cache, input_name, is_cache, unflatten_cache
from .observer import Call

# Names for well-known axes: (flat input name pattern, axis, name); the first match names a group.
KNOWN_AXES: list[tuple[str, int, str]] = [
    ("input_ids", 0, "batch_size"),
    ("input_ids", 1, "sequence_length"),
    ("inputs_embeds", 0, "batch_size"),
    ("inputs_embeds", 1, "sequence_length"),
    ("pixel_values", 0, "batch_size"),
    ("past_key_values.*.encoder.*", -2, "encoder_sequence_length"),
    ("past_key_values.*.decoder.*", -2, "past_decoder_sequence_length"),
    ("past_key_values.*", -2, "past_sequence_length"),
    ("encoder_hidden_states", 1, "encoder_sequence_length"),
    ("encoder_attention_mask", 1, "encoder_sequence_length"),
    ("attention_mask", 0, "batch_size"),
]

SLIDING_PAST = "sliding_past_sequence_length"  # the past of a sliding-window layer: at most window - 1
# Names for axes that are neither known above nor a sum of named axes.
FALLBACK_AXES = {("attention_mask", 1): "total_sequence_length"}


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
                if name == kwarg or name.startswith(input_name(kwarg, "")):
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


def name_axes(
    flats: list[dict[str, torch.Tensor]], dynamic: dict[str, set[int]], bounded: set[str] = frozenset()
) -> dict[str, dict[int, str]]:
    """`bounded`: cache inputs whose length axis (-2) is capped by a sliding window; that axis never
    shares a name with the full past, even when the calls never filled the window."""
    ranks = {name: next(f[name].dim() for f in flats if name in f) for name in dynamic}
    keys = [(name, axis) for name, axes in dynamic.items() for axis in sorted(axes)]
    sizes = {key: _axis_sizes(flats, *key) for key in keys}

    def capped(key) -> bool:
        return key[0] in bounded and key[1] == ranks[key[0]] - 2

    groups: list[list[tuple[str, int]]] = []
    for key in keys:
        group = next((g for g in groups if _same(sizes[g[0]], sizes[key]) and capped(g[0]) == capped(key)), None)
        group.append(key) if group is not None else groups.append([key])

    def known(group) -> str | None:
        if capped(group[0]):
            return SLIDING_PAST
        for pattern, axis, label in KNOWN_AXES:
            for name, ax in group:
                if fnmatch.fnmatchcase(name, pattern) and ax == axis % ranks[name]:
                    return label
        return None

    labels: dict[int, str | None] = {}
    used: dict[str, int] = {}
    for group in groups:  # a name is one group's: a second group with the same role gets a suffix
        label = known(group)
        if label is not None:
            used[label] = used.get(label, 0) + 1
            label = label if used[label] == 1 else f"{label}_{used[label]}"
        labels[id(group)] = label

    def varying(group) -> bool:
        return len({v for v in sizes[group[0]] if v is not None}) > 1

    # a constant axis is no summand, nor a capped one (its sum with the new tokens stops growing)
    named = [g for g in groups if labels[id(g)] and varying(g) and not capped(g[0])]
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
            labels[id(group)] = FALLBACK_AXES.get((name, axis), f"{name}_dim_{axis}")
    return {
        name: {axis: labels[id(g)] for g in groups for n, axis in g if n == name}
        for name in dynamic
        if dynamic[name]
    }


def _follows(sizes: list[int | None], leader: list[int | None]) -> bool:
    """Equal wherever both exist, and the equality is evidence: the leader varies over those calls,
    or the follower was seen in one call only (a constant 1 heads axis does not follow one-token steps)."""
    pairs = [(a, b) for a, b in zip(sizes, leader) if a is not None and b is not None]
    if not pairs or any(a != b for a, b in pairs):
        return False
    return sum(v is not None for v in sizes) == 1 or len({b for _, b in pairs}) > 1


def _follow_dynamic(flats, names: list[str], dynamic: dict[str, set[int]]) -> None:
    """A static axis becomes dynamic when it follows, at the same index, a dynamic axis of another input
    of the same rank (e.g. `token_type_ids` given in one call only follows `input_ids`)."""
    for n in names:
        rank = len(shape_of(flats, n))
        leaders = [m for m in names if m != n and len(shape_of(flats, m)) == rank]
        for axis in range(rank):
            sizes = _axis_sizes(flats, n, axis)
            if axis not in dynamic[n] and any(
                axis in dynamic[m] and _follows(sizes, _axis_sizes(flats, m, axis)) for m in leaders
            ):
                dynamic[n].add(axis)


def shape_of(flats, name: str) -> tuple[int, ...]:
    return next(tuple(f[name].shape) for f in flats if name in f)


def batch_axes(flats: list[dict[str, torch.Tensor]], names: list[str]) -> set[str]:
    """Inputs whose axis 0 has the first input's size in every call (0-d inputs have none)."""
    ranked = [n for n in names if shape_of(flats, n)]
    if not ranked or ranked[0] != names[0]:
        return set()
    first = _axis_sizes(flats, names[0], 0)
    return {n for n in ranked if _same(_axis_sizes(flats, n, 0), first)}


def sequence_axes(flats: list[dict[str, torch.Tensor]], names: list[str]) -> set[str]:
    """`input_ids`/`inputs_embeds`, and inputs of the same rank whose axis 1 has their length in every call."""
    leaders = [n for n in ("input_ids", "inputs_embeds") if n in names]
    return {
        n
        for lead in leaders
        for n in names
        if len(shape_of(flats, n)) == len(shape_of(flats, lead)) and _same(_axis_sizes(flats, n, 1), _axis_sizes(flats, lead, 1))
    }


def _extend(t: torch.Tensor, axis: int, extra: int) -> torch.Tensor:
    """`t` with `extra` more entries on `axis`: copies of the last slice, or zeros if it has none."""
    if t.shape[axis] == 0:
        shape = list(t.shape)
        shape[axis] = extra
        return torch.zeros(shape, dtype=t.dtype)
    last = t.narrow(axis, t.shape[axis] - 1, 1)
    return torch.cat([t] + [last] * extra, dim=axis)


def _grown(kwargs: dict[str, Any], dynamic: dict[str, set[int]], labels: dict[str, dict[int, str]]) -> dict:
    """Grow every short dynamic axis of a sample to 2, keeping "A + B" axes equal to the sum."""
    flat = flat_inputs(kwargs, list(kwargs))
    sizes: dict[str, int] = {}
    for n in dynamic:
        for a in dynamic[n] if n in flat else ():
            sizes[labels[n][a]] = min(sizes.get(labels[n][a], flat[n].shape[a]), flat[n].shape[a])
    extra = {label: max(0, 2 - size) for label, size in sizes.items() if " + " not in label}
    extra.update({label: sum(extra.get(p, 0) for p in label.split(" + ")) for label in sizes if " + " in label})

    def grow(name: str, t: torch.Tensor) -> torch.Tensor:
        for axis in sorted(dynamic.get(name, ())):
            if extra.get(labels[name][axis]):
                t = _extend(t, axis, extra[labels[name][axis]])
        return t

    grown = {}
    for key, value in kwargs.items():
        if isinstance(value, torch.Tensor):
            grown[key] = grow(key, value)
        elif is_cache(value):
            leaves, tensors, context = flatten_cache(value)
            tensors = [grow(input_name(key, leaf), t) for leaf, t in zip(leaves, tensors)]
            grown[key] = unflatten_cache(type(value), context, tensors)
        else:
            grown[key] = value
    return grown


def infer_arguments(
    calls: Sequence[Call],
    inputs: Sequence[str],
    constants: dict[str, Any] | None = None,
    *,
    dynamic_batch: bool = True,
    dynamic_sequence: bool = False,
) -> ExportArguments:
    """Export arguments for the kwargs `inputs` (in graph order), plus fixed `constants`.
    `dynamic_batch=False` keeps a batch size that never varied fixed; `dynamic_sequence=True` makes
    the sequence axis dynamic even when every call had the same length."""
    if not calls:
        raise CaptureError("no forward call was recorded: nothing to infer the export inputs from")
    flats = [flat_inputs(c.kwargs, inputs) for c in calls]
    present = [n for n in inputs if any(k == n or k.startswith(input_name(n, "")) for f in flats for k in f)]
    names = _ordered_union(flats, present)
    shapes = {n: [tuple(f[n].shape) for f in flats if n in f] for n in names}
    dynamic = {n: _dynamic_axes(shapes[n], n) for n in names}
    forced = {n for n in batch_axes(flats, names) if 0 not in dynamic[n]} if dynamic_batch else set()
    for n in forced:
        dynamic[n].add(0)
    if dynamic_sequence:
        for n in sequence_axes(flats, names):
            dynamic[n].add(1)
    _follow_dynamic(flats, names, dynamic)
    # A sliding layer's past stays dynamic even if every call had a full window (decode steps only).
    bounded = set().union(*(bounded_inputs(c.kwargs, present) for c in calls)) & set(names)
    for n in bounded:
        dynamic[n].add(len(shapes[n][0]) - 2)

    def ready(i: int) -> tuple[int, int]:
        """(every dynamic axis >= 2, how many are) for call i."""
        sizes = [flats[i][n].shape[a] for n in names for a in dynamic[n]]
        return int(all(s >= 2 for s in sizes)), sum(s >= 2 for s in sizes)

    complete = [i for i, f in enumerate(flats) if set(f) == set(names)]
    if not complete:
        raise CaptureError(f"no recorded call has all of the inputs {names}")
    best = max(complete, key=lambda i: (ready(i), i))
    labels = name_axes(flats, dynamic, bounded)
    sample = calls[best].kwargs
    kwargs = {n: sample[n] for n in present}
    if not ready(best)[0]:
        kwargs = _grown(kwargs, dynamic, labels)
    dynamic_shapes: dict[str, Any] = {}
    for n in present:
        if is_cache(sample[n]):
            leaves = [k for k in names if k.startswith(input_name(n, ""))]
            dynamic_shapes[n] = [{a: torch.export.Dim.DYNAMIC for a in sorted(dynamic[k])} for k in leaves]
        else:
            dynamic_shapes[n] = {a: torch.export.Dim.DYNAMIC for a in sorted(dynamic[n])} or None
    kwargs.update(constants or {})
    dynamic_shapes.update({k: None for k in constants or {}})
    return ExportArguments(kwargs, dynamic_shapes, names, labels, best, shapes)
