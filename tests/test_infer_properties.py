"""Property tests for `capture.infer`: dynamic axes, the sample, input names and axis names.

Calls are built directly (`Call(kwargs)`) from real `torch.zeros` tensors and real
`transformers.DynamicCache` objects filled with `cache.update(k, v, layer_idx)`; the expected
results come from a small oracle written from the rules in docs/capture.md:

- an axis is dynamic iff its size differs between the calls where that input is present, or it
  follows another input's dynamic axis (same rank, same index), or it is a batch axis (dynamic_batch);
- the sample is a recorded call that has every input and in which every dynamic axis is >= 2; when
  there is none, the best call is grown (every dynamic axis >= 2, "A + B" axes kept as sums);
- axes whose sizes are equal in every call share a name; well-known axes are named (`batch_size`,
  `sequence_length`, `past_sequence_length`; a second group in the same role gets a suffix) and an
  attention-mask axis that is always past + sequence is named `past_sequence_length + sequence_length`;
- rank changes are a `CaptureError` naming the input.

Five bugs these properties found (model dimensions made dynamic by the follow rule, growth keyed by
name, one name for different sizes, an empty cache counted as present, 0-d inputs and batch axes) are
fixed; their minimal examples stay as regression tests below.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from transformers import DynamicCache

from optimum_dynamo.capture.infer import CaptureError, infer_arguments, name_axes
from optimum_dynamo.capture.observer import Call

DYNAMIC = torch.export.Dim.DYNAMIC
PAST = "past_key_values"
SETTINGS = settings(
    max_examples=60,
    derandomize=True,  # deterministic: same examples on every run, no example database
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    report_multiple_bugs=False,
)

# Another change may add keyword options to infer_arguments (e.g. `dynamic_batch`, which makes
# batch axes dynamic even when the batch never varied). The docstring rules tested here are the
# ones without that option, so it is switched off when it exists.
_OPTIONS = {"dynamic_batch": False} if "dynamic_batch" in inspect.signature(infer_arguments).parameters else {}


def infer(calls, inputs, constants=None):
    return infer_arguments(calls, inputs, constants, **_OPTIONS)


# ----------------------------------------------------------------------------------------------
# Call specs: {kwarg: ("t", shape) | ("c", [(key_shape, value_shape), ...]) | ("none",)};
# a missing kwarg is a call without it.


def build_call(spec: dict) -> Call:
    kwargs = {}
    for name, value in spec.items():
        if value[0] == "t":
            dtype = torch.float32 if name in ("inputs_embeds", "pixel_values", "x") else torch.long
            kwargs[name] = torch.zeros(value[1], dtype=dtype)
        elif value[0] == "c":
            cache = DynamicCache()
            for layer, (key, val) in enumerate(value[1]):
                cache.update(torch.zeros(key), torch.zeros(val), layer)
            kwargs[name] = cache
        else:
            kwargs[name] = None
    return Call(kwargs)


def flat_spec(spec: dict, inputs) -> dict[str, tuple[int, ...]]:
    """The flat names and shapes a call should contribute (the oracle's flatten)."""
    flat = {}
    for name in inputs:
        value = spec.get(name, ("none",))
        if value[0] == "t":
            flat[name] = tuple(value[1])
        elif value[0] == "c":
            for i, (key, val) in enumerate(value[1]):
                flat[f"{PAST}.{i}.key"], flat[f"{PAST}.{i}.value"] = tuple(key), tuple(val)
    return flat


def agree(a: list, b: list) -> bool:
    """Sizes equal in every call where both are present (and there is at least one such call)."""
    both = [(x, y) for x, y in zip(a, b) if x is not None and y is not None]
    return bool(both) and all(x == y for x, y in both)


@dataclass
class Expected:
    flats: list[dict[str, tuple[int, ...]]]
    present: list[str]  # kwargs of `inputs` that some call carries
    names: list[str]  # flat names in graph order
    leaves: dict[str, list[str]]  # cache kwarg -> its flat names
    shapes: dict[str, list[tuple[int, ...]]]
    rank_changes: set[str]
    dynamic: dict[str, set[int]]
    complete: list[int]  # calls with every input
    valid: list[int]  # calls with every input and every dynamic axis >= 2

    def sizes(self, name: str, axis: int) -> list:
        return [f[name][axis] if name in f else None for f in self.flats]


def oracle(specs: list[dict], inputs: list[str]) -> Expected:
    flats = [flat_spec(s, inputs) for s in specs]
    present = [n for n in inputs if any(s.get(n, ("none",))[0] != "none" for s in specs)]
    names, leaves = [], {}
    for n in present:
        if any(s.get(n, ("none",))[0] == "c" for s in specs):
            layers = max(len(s[n][1]) for s in specs if s.get(n, ("none",))[0] == "c")
            leaves[n] = [f"{PAST}.{i}.{part}" for i in range(layers) for part in ("key", "value")]
            names += leaves[n]
        else:
            names.append(n)
    shapes = {n: [f[n] for f in flats if n in f] for n in names}
    rank_changes = {n for n in names if len({len(s) for s in shapes[n]}) > 1}
    dynamic = {
        n: {a for a in range(len(shapes[n][0])) if len({s[a] for s in shapes[n]}) > 1}
        for n in names
        if n not in rank_changes
    }
    complete = [i for i, f in enumerate(flats) if set(f) == set(names)]
    valid = [] if rank_changes else [
        i for i in complete if all(flats[i][n][a] >= 2 for n in names for a in dynamic[n])
    ]
    return Expected(flats, present, names, leaves, shapes, rank_changes, dynamic, complete, valid)


def passed_flat(kwargs: dict, exp: Expected) -> dict[str, tuple[int, ...]]:
    """Flat names and shapes of the kwargs infer_arguments passes on (caches read layer by layer)."""
    flat = {}
    for n in exp.present:
        value = kwargs[n]
        if isinstance(value, torch.Tensor):
            flat[n] = tuple(value.shape)
        else:
            assert isinstance(value, DynamicCache), type(value)
            layers = [layer for layer in value.layers if getattr(layer, "is_initialized", layer.keys is not None)]
            for i, layer in enumerate(layers):
                flat[f"{PAST}.{i}.key"], flat[f"{PAST}.{i}.value"] = tuple(layer.keys.shape), tuple(layer.values.shape)
    return flat


def _follows_dynamic() -> bool:
    """Whether infer_arguments also makes dynamic an axis seen with one size only when it matches a
    dynamic axis of another input (the newer rule); probed, not read."""
    calls = [Call({"a": torch.zeros(2, 3)}), Call({"a": torch.zeros(2, 4), "b": torch.zeros(5, 4)})]
    try:
        return 1 in (infer(calls, ["a", "b"]).dynamic_shapes["b"] or {})
    except CaptureError:
        return False


FOLLOWS = _follows_dynamic()


def dynamic_axes_of(args, exp: Expected) -> dict[str, set[int]]:
    """The dynamic axes of the result per flat name; checks that they are all Dim.DYNAMIC."""
    got = {}
    for n in exp.present:
        shapes = args.dynamic_shapes[n]
        if n in exp.leaves:
            assert isinstance(shapes, (list, tuple)) and len(shapes) == len(exp.leaves[n])
            got.update((leaf, set(axes)) for leaf, axes in zip(exp.leaves[n], shapes))
        else:  # a dict of dynamic axes, or None when there is none
            assert shapes is None or (isinstance(shapes, dict) and shapes), (n, shapes)
            got[n] = set(shapes or {})
        for axes in shapes if n in exp.leaves else [shapes or {}]:
            assert all(v == DYNAMIC for v in axes.values()), (n, axes)
    return got


def check_inference(specs, inputs, constants=None):
    """Properties 1, 2, 3, 5 and 6 against the oracle; returns (calls, expected, args or None).
    On return, `expected.dynamic` holds the dynamic axes of the result (checked against the oracle)."""
    calls = [build_call(s) for s in specs]
    exp = oracle(specs, inputs)
    try:
        args = infer(calls, inputs, constants)
    except CaptureError as error:
        event("CaptureError")
        # 2 / 5: an error only when no call can be the sample, or an input changes rank
        assert exp.rank_changes or not exp.valid, f"unexpected CaptureError: {error}"
        if exp.rank_changes:
            assert any(repr(n) in str(error) for n in exp.rank_changes), str(error)
        return calls, exp, None
    assert not exp.rank_changes, f"rank changes of {exp.rank_changes} not reported"
    assert exp.complete, "no call has every input, yet no CaptureError"

    # 3: flat names in the order of `inputs`, caches expanded as past_key_values.{i}.key/.value
    assert args.input_names == exp.names
    assert args.shapes == exp.shapes

    # 1: an axis is in dynamic_shapes (as Dim.DYNAMIC) iff its size varies; static axes absent.
    # (Newer rule: an axis seen with one size only may also be dynamic when it matches, wherever both
    # appear, a dynamic axis at the same index of another input. Allowed only when infer.py does so.)
    got = dynamic_axes_of(args, exp)
    assert set(got) == set(exp.names)
    for n in exp.names:
        assert exp.dynamic[n] <= got[n], (n, "varying axes missing", exp.dynamic[n] - got[n])
        for a in got[n] - exp.dynamic[n]:
            assert FOLLOWS, (n, a, "never varies but is dynamic")
            assert any(m != n and a in got[m] and agree(exp.sizes(n, a), exp.sizes(m, a)) for m in exp.names), (n, a)
    exp.dynamic = got
    exp.valid = [i for i in exp.complete if all(exp.flats[i][n][a] >= 2 for n in exp.names for a in got[n])]

    # 2: the sample is a recorded call that has every input ...
    assert args.sample_call in exp.complete
    sample = calls[args.sample_call].kwargs
    event("sample: a recorded call" if exp.valid else "sample: grown")
    if exp.valid:  # ... one whose dynamic axes are all >= 2, passed unchanged, when there is one
        assert args.sample_call in exp.valid
        for n in exp.present:
            assert args.kwargs[n] is sample[n]
    # Without such a call, the first rule was a CaptureError; now the best call is grown. Either way,
    # what is passed on has the call's names and ranks, the call's static sizes, every dynamic axis >= 2.
    passed, recorded = passed_flat(args.kwargs, exp), exp.flats[args.sample_call]
    assert set(passed) == set(exp.names)
    for n in exp.names:
        assert len(passed[n]) == len(recorded[n]), n
        for a, (now, before) in enumerate(zip(passed[n], recorded[n])):
            if a in got[n]:
                assert now >= 2 and now >= before, (n, a, before, now)
            else:
                assert now == before, (n, a, before, now)

    # a grown sample keeps the recorded relations between named axes: axes with one name and equal
    # sizes stay equal, and an axis named "A + B" stays the sum of an A axis and a B axis
    assert args.axis_names == {n: {a: args.axis_names[n][a] for a in axes} for n, axes in got.items() if axes}
    keys = [(n, a) for n, axes in got.items() for a in sorted(axes)]
    label = {(n, a): args.axis_names[n][a] for n, a in keys}
    for k1 in keys:
        for k2 in keys:
            if label[k1] == label[k2] and recorded[k1[0]][k1[1]] == recorded[k2[0]][k2[1]]:
                assert passed[k1[0]][k1[1]] == passed[k2[0]][k2[1]], (k1, k2, label[k1])
        if " + " in label[k1]:
            first, second = label[k1].split(" + ")
            for ka in (k for k in keys if label[k] == first):
                for kb in (k for k in keys if label[k] == second):
                    if recorded[k1[0]][k1[1]] == recorded[ka[0]][ka[1]] + recorded[kb[0]][kb[1]]:
                        assert passed[k1[0]][k1[1]] == passed[ka[0]][ka[1]] + passed[kb[0]][kb[1]], (k1, ka, kb)

    # 6: constants are passed as they are, with a None dynamic shape
    constants = constants or {}
    assert set(args.kwargs) == set(exp.present) | set(constants)
    assert set(args.dynamic_shapes) == set(args.kwargs)
    for k, v in constants.items():
        assert args.kwargs[k] is v and args.dynamic_shapes[k] is None
    return calls, exp, args


# ----------------------------------------------------------------------------------------------
# Strategies

SIZE = st.integers(0, 4)
TENSOR_NAMES = ["input_ids", "attention_mask", "position_ids", "token_type_ids", "pixel_values", "x"]
CONSTANTS = st.dictionaries(
    st.sampled_from(["use_cache", "return_dict", "output_attentions", "logits_to_keep"]),
    st.one_of(st.booleans(), st.integers(0, 3), st.none()),
    max_size=3,
)


@st.composite
def shape_sets(draw, rank_change: bool = False):
    """Arbitrary shape sets: 1-3 tensor inputs of fixed rank (0-3), maybe a cache, 0-5 calls."""
    tensors = draw(st.lists(st.sampled_from(TENSOR_NAMES), min_size=1, max_size=3, unique=True))
    with_cache = draw(st.booleans())
    inputs = draw(st.permutations(tensors + ([PAST] if with_cache else [])))
    inputs = inputs + draw(st.sampled_from([[], ["inputs_embeds"]]))  # never recorded
    ranks = {n: draw(st.integers(0, 3)) for n in tensors}
    layers = draw(st.integers(1, 2))
    n_calls = draw(st.integers(2 if rank_change else 0, 5))
    specs = []
    for _ in range(n_calls):
        spec = {}
        for n in tensors:
            kind = draw(st.sampled_from(["t"] * 6 + ["absent", "none"]))
            if kind == "t":
                spec[n] = ("t", tuple(draw(SIZE) for _ in range(ranks[n])))
            elif kind == "none":
                spec[n] = ("none",)
        if with_cache:
            kind = draw(st.sampled_from(["c"] * 4 + ["absent", "none"]))
            if kind == "c":
                pairs = []
                for _ in range(draw(st.integers(1, layers))):
                    key = tuple(draw(SIZE) for _ in range(4))
                    pairs.append((key, key[:3] + (draw(st.sampled_from([key[3], draw(SIZE)])),)))
                spec[PAST] = ("c", pairs)
            elif kind == "none":
                spec[PAST] = ("none",)
        specs.append(spec)
    if rank_change:  # one tensor input gets another rank in one call
        n = draw(st.sampled_from(tensors))
        i, j = draw(st.lists(st.integers(0, n_calls - 1), min_size=2, max_size=2, unique=True))
        specs[i][n] = ("t", tuple(draw(SIZE) for _ in range(ranks[n])))
        other = (ranks[n] + draw(st.integers(1, 3))) % 4
        specs[j][n] = ("t", tuple(draw(SIZE) for _ in range(other)))
    return specs, inputs


DECODER_INPUTS = ["input_ids", "inputs_embeds", "attention_mask", "position_ids", PAST, "cache_position"]


@st.composite
def decoder_calls(draw, sliding_window: bool = False):
    """Realistic decoder forward calls: generate() runs of prefill then decode steps.

    batch 1..4 (fixed, or varying between runs), a prefill without a cache (kwarg absent or
    None) or on a prefix cache, decode steps of 1..3 tokens (chunked or assisted decoding),
    attention_mask over past + new tokens, cache (batch, heads, past, head_dim) per layer.
    With `sliding_window`, one layer keeps at most `window` past positions.
    """
    layers, heads, head_dim = draw(st.integers(1, 3)), draw(st.integers(1, 2)), draw(st.integers(1, 3))
    window = draw(st.integers(1, 3)) if sliding_window else None
    sliding = draw(st.integers(0, layers - 1))
    vary_batch = draw(st.booleans())
    batch = draw(st.integers(1, 4))
    positions, cache_positions = draw(st.booleans()), draw(st.booleans())
    no_cache = draw(st.sampled_from(["absent", "none"]))
    one_token_steps = draw(st.booleans())  # plain generate(): every decode step is one token
    specs = []
    for _ in range(draw(st.integers(1, 3))):
        b = draw(st.integers(1, 4)) if vary_batch else batch
        past = draw(st.sampled_from([0, 0, 0, 1, 2, 3]))  # 0: plain prefill; > 0: prefix cache
        steps = st.just(1) if one_token_steps else st.integers(1, 3)
        for q in [draw(st.integers(1, 6))] + draw(st.lists(steps, max_size=4)):
            spec = {"input_ids": ("t", (b, q)), "attention_mask": ("t", (b, past + q))}
            if positions:
                spec["position_ids"] = ("t", (b, q))
            if cache_positions:
                spec["cache_position"] = ("t", (q,))
            if past:
                lengths = [past] * layers
                if window is not None:
                    lengths[sliding] = min(past, window)
                spec[PAST] = ("c", [((b, heads, p, head_dim),) * 2 for p in lengths])
            elif no_cache == "none":
                spec[PAST] = ("none",)
            specs.append(spec)
            past += q
    return specs


# ----------------------------------------------------------------------------------------------
# infer_arguments


@SETTINGS
@given(shape_sets(), CONSTANTS)
def test_arbitrary_shape_sets(example, constants):
    """1, 2, 3, 6 on arbitrary shapes (sizes 0..4, inputs and caches missing from some calls)."""
    specs, inputs = example
    check_inference(specs, inputs, constants)


@SETTINGS
@given(decoder_calls(), CONSTANTS)
def test_decoder_calls(specs, constants):
    """1, 2, 3, 6 on realistic decoder call sequences."""
    check_inference(specs, DECODER_INPUTS, constants)


@SETTINGS
@given(shape_sets(rank_change=True))
def test_rank_change_is_an_error_naming_the_input(example):
    """5: an input whose rank changes between calls raises CaptureError naming it."""
    specs, inputs = example
    exp = oracle(specs, inputs)
    assert exp.rank_changes
    with pytest.raises(CaptureError) as error:
        infer([build_call(s) for s in specs], inputs)
    assert any(repr(n) in str(error.value) for n in exp.rank_changes)
    assert "rank" in str(error.value)


@SETTINGS
@given(
    st.integers(2, 4),
    st.lists(st.tuples(st.integers(1, 4), st.integers(0, 4)), min_size=2, max_size=4),
    st.sampled_from([2, 3, 5]),
)
def test_cache_rank_change_is_an_error_naming_the_leaf(layers, calls, odd_rank):
    """5 for cache leaves: the last layer's tensors have another rank in the last call."""
    specs = [{PAST: ("c", [((b, 2, p, 2),) * 2] * layers)} for b, p in calls]
    specs[-1][PAST][1][-1] = ((1,) * odd_rank,) * 2
    exp = oracle(specs, [PAST])
    with pytest.raises(CaptureError, match=rf"'{PAST}\.{layers - 1}\.(key|value)'.*rank"):
        infer([build_call(s) for s in specs], [PAST])
    assert exp.rank_changes == {f"{PAST}.{layers - 1}.key", f"{PAST}.{layers - 1}.value"}


def test_no_calls_is_an_error():
    with pytest.raises(CaptureError, match="no forward call"):
        infer([], ["input_ids"])


# ----------------------------------------------------------------------------------------------
# Axis names on decoder calls (property 4)


@SETTINGS
@given(decoder_calls(), st.booleans())
def test_decoder_axis_names(specs, with_constants):
    calls, exp, args = check_inference(specs, DECODER_INPUTS, {"use_cache": True} if with_constants else None)
    if args is None:
        return
    names, dyn = args.axis_names, exp.dynamic
    keys = [(n, a) for n, axes in dyn.items() for a in axes]

    # axes whose sizes are equal in every call share a name ...
    for (n1, a1) in keys:
        for (n2, a2) in keys:
            if exp.sizes(n1, a1) == exp.sizes(n2, a2):
                assert names[n1][a1] == names[n2][a2], ((n1, a1), (n2, a2))
    # ... and so do all the batch axes (equal wherever both are present)
    if 0 in dyn["input_ids"]:
        assert names["input_ids"][0] == "batch_size"
        for n in exp.names:
            if n != "cache_position" and 0 in dyn[n]:
                assert names[n][0].startswith("batch_size"), n

    ids0 = exp.sizes("input_ids", 0) if 0 in dyn["input_ids"] else None
    ids1 = exp.sizes("input_ids", 1) if 1 in dyn["input_ids"] else None
    mask1 = exp.sizes("attention_mask", 1) if 1 in dyn["attention_mask"] else None
    past = exp.sizes(f"{PAST}.0.key", 2) if f"{PAST}.0.key" in dyn and 2 in dyn[f"{PAST}.0.key"] else None
    # well-known axes, unless their sizes coincide with an axis of a higher-priority name
    seq_named = ids1 is not None and not (ids0 and agree(ids0, ids1))
    if seq_named:
        event("named: sequence_length")
        assert names["input_ids"][1] == "sequence_length"
    past_named = past is not None and not any(s and agree(s, past) for s in (ids0, ids1, mask1))
    if past_named:
        event("named: past_sequence_length")
        for leaf in exp.leaves[PAST]:
            assert names[leaf][2].startswith("past_sequence_length"), leaf

    # attention_mask axis 1 = past + sequence (over >= 2 calls with both) -> named after the sum
    if seq_named and past_named and mask1 is not None and not any(s and agree(s, mask1) for s in (ids0, ids1)):
        total = [p + q if p is not None else None for p, q in zip(past, ids1)]
        assert sum(t is not None for t in total) >= 2 and agree(total, mask1)
        other_sums = [
            [b + x if x is not None else None for b, x in zip(ids0, other)] for other in (ids1, past)
        ] if ids0 else []
        if not any(agree(s, mask1) and sum(v is not None for v in s) >= 2 for s in other_sums):
            event("named: past_sequence_length + sequence_length")
            assert names["attention_mask"][1] == "past_sequence_length + sequence_length"


@SETTINGS
@given(decoder_calls(sliding_window=True))
def test_axes_that_differ_get_different_names(specs):
    """Converse of 'equal sizes share a name': two dynamic axes with one name have equal sizes in
    every call where both are present (not in the brief's list; ONNX dim_params assert equality)."""
    _, exp, args = check_inference(specs, DECODER_INPUTS)
    if args is None:
        return
    keys = [(n, a) for n, axes in exp.dynamic.items() for a in axes]
    for (n1, a1) in keys:
        for (n2, a2) in keys:
            if args.axis_names[n1][a1] == args.axis_names[n2][a2]:
                assert agree(exp.sizes(n1, a1), exp.sizes(n2, a2)), (n1, a1, n2, a2, args.axis_names[n1][a1])


# ----------------------------------------------------------------------------------------------
# name_axes directly


@st.composite
def flats_and_dynamic(draw):
    """Flat inputs (some missing from some calls) and any set of axes declared dynamic."""
    specs, inputs = draw(shape_sets())
    specs = [s for s in specs if s] or [{inputs[0]: ("t", (2, 3))} if inputs[0] != PAST else {}]
    exp = oracle(specs, inputs)
    flats = [
        {n: torch.zeros(shape) for n, shape in flat.items()} for flat in exp.flats
    ]
    dynamic = {}
    for n in exp.names:
        if n in exp.rank_changes:
            continue
        rank = len(exp.shapes[n][0])
        dynamic[n] = set(draw(st.lists(st.integers(0, rank - 1), unique=True))) if rank else set()
    return exp, flats, dynamic


@SETTINGS
@given(flats_and_dynamic())
def test_name_axes(example):
    exp, flats, dynamic = example
    names = name_axes(flats, dynamic)
    assert names == {n: {a: names[n][a] for a in axes} for n, axes in dynamic.items() if axes}
    keys = [(n, a) for n, axes in dynamic.items() for a in sorted(axes)]
    assert all(isinstance(names[n][a], str) and names[n][a] for n, a in keys)
    # equal sizes in every call -> one name
    for k1 in keys:
        for k2 in keys:
            if exp.sizes(*k1) == exp.sizes(*k2):
                assert names[k1[0]][k1[1]] == names[k2[0]][k2[1]], (k1, k2)
    # well-known axes
    if 0 in dynamic.get("input_ids", ()):
        assert names["input_ids"][0] == "batch_size"
    if 1 in dynamic.get("input_ids", ()):
        ids1 = exp.sizes("input_ids", 1)
        if not any(agree(exp.sizes(*k), ids1) for k in keys if k != ("input_ids", 1)):
            assert names["input_ids"][1] == "sequence_length"
    past = [(n, 2) for n in dynamic if n.startswith(PAST + ".") and 2 in dynamic[n]]
    if past and not any(agree(exp.sizes(*k), exp.sizes(*p)) for k in keys if k not in past for p in past):
        assert all(names[n][a].startswith("past_sequence_length") for n, a in past)


# ----------------------------------------------------------------------------------------------
# Calls whose cache flattens to no tensor (an empty DynamicCache, as generate() passes to prefill)


@SETTINGS
@given(
    st.lists(
        st.tuples(st.integers(1, 3), st.integers(2, 5), st.sampled_from(["absent", "none", "empty"])),
        min_size=2,
        max_size=4,
    )
)
def test_empty_caches_raise_capture_error_or_are_left_out(calls):
    """An empty cache adds no input: the result is a CaptureError or a sample; never KeyError."""
    recorded = []
    for batch, seq, cache in calls:
        kwargs = {"input_ids": torch.zeros(batch, seq, dtype=torch.long)}
        if cache != "absent":
            kwargs[PAST] = DynamicCache() if cache == "empty" else None
        recorded.append(Call(kwargs))
    try:
        args = infer(recorded, ["input_ids", PAST])
    except CaptureError:
        return
    assert args.input_names == ["input_ids"]
    assert args.kwargs["input_ids"] is recorded[args.sample_call].kwargs["input_ids"]


# ----------------------------------------------------------------------------------------------
# Checks tied to the newer rules (sample growth, `dynamic_batch`, following axes): conditional on
# infer.py having them.


def _grows_samples() -> bool:
    """Whether infer_arguments grows a call when none has every dynamic axis >= 2."""
    calls = [Call({"input_ids": torch.zeros(1, n, dtype=torch.long)}) for n in (0, 1)]
    try:
        infer(calls, ["input_ids"])
    except CaptureError:
        return False
    return True


@SETTINGS
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2)), min_size=2, max_size=4))
def test_sample_axes_of_layers_with_different_pasts_are_at_least_2(pasts):
    """2 with cache layers whose past lengths differ: the sample passed on has every dynamic axis >= 2."""
    specs = [{"input_ids": ("t", (1, 1)), PAST: ("c", [((1, 1, p, 1),) * 2 for p in layer_pasts])}
             for layer_pasts in pasts]
    check_inference(specs, ["input_ids", PAST])


@SETTINGS
@given(shape_sets())
def test_default_options_raise_only_capture_error(example):
    """With infer_arguments' default options, arbitrary shape sets give a result or a CaptureError,
    and every axis declared dynamic is >= 2 in the sample passed on."""
    specs, inputs = example
    exp = oracle(specs, inputs)
    try:
        args = infer_arguments([build_call(s) for s in specs], inputs)
    except CaptureError:
        return
    passed = passed_flat(args.kwargs, exp)
    for n in exp.present:
        shapes = args.dynamic_shapes[n]
        for leaf, axes in zip(exp.leaves.get(n, [n]), shapes if n in exp.leaves else [shapes or {}]):
            assert all(passed[leaf][a] >= 2 for a in axes), (leaf, axes, passed[leaf])


@SETTINGS
@given(decoder_calls())
def test_model_dimensions_of_the_cache_stay_static(specs):
    """Cache axes that never vary (KV heads, head_dim) are not dynamic and keep their size in the
    sample, whatever the other inputs' sizes (1 in the test above, made explicit here)."""
    _, exp, args = check_inference(specs, DECODER_INPUTS)
    if args is None:
        return
    recorded = exp.flats[args.sample_call]
    passed = passed_flat(args.kwargs, exp)
    for leaf in exp.leaves.get(PAST, []):
        assert not exp.dynamic[leaf] & {1, 3}, (leaf, exp.dynamic[leaf])
        assert (passed[leaf][1], passed[leaf][3]) == (recorded[leaf][1], recorded[leaf][3]), leaf
