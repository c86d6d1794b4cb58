"""State caches of state-space / linear-attention / convolution layers (Mamba, Jamba, LFM2, Qwen3-Next...).

Leaf names, the same in every transformers version: ``N.conv_state`` and ``N.recurrent_state`` for
layer N (transformers 5's `conv_states` / `recurrent_states`; transformers 4's Mamba `ssm_states`
are the recurrent state). A layer with more than one state adds ``N.conv_state_1``, ... Attention
layers keep ``N.key`` / ``N.value``. Unlike keys and values, states have no sequence axis: their
shape is fixed by the config, only the batch varies.

- transformers >= 5: linear-attention layers (`LinearAttentionLayer` and the hybrid
  `LinearAttentionAnd*AttentionLayer`) inside `DynamicCache`; `flatten_dynamic` asks `layer_leaves`.
- transformers 4: one class per model family, each registered below.
"""

from __future__ import annotations

import torch

from .registry import register_cache

CONV, RECURRENT = "conv_state", "recurrent_state"


def is_state_layer(layer) -> bool:
    """A transformers >= 5 linear-attention cache layer (possibly also holding keys/values)."""
    return hasattr(layer, "conv_states") and hasattr(layer, "recurrent_states")


def state_name(kind: str, index: int) -> str:
    return kind if index == 0 else f"{kind}_{index}"


def _states(layer) -> int:
    """How many states the layer holds: transformers >= 5.2x keeps lists (`number_of_states`), 5.13 one state in
    plain attributes."""
    return getattr(layer, "number_of_states", None) or 1


def _get(layer, name: str, i: int):
    value = getattr(layer, name)
    return value[i] if hasattr(layer, "number_of_states") else value


def _set(layer, name: str, i: int, value) -> None:
    if hasattr(layer, "number_of_states"):
        getattr(layer, name)[i] = value
    else:
        setattr(layer, name, value)


def layer_leaves(layer) -> tuple[list[str], list[torch.Tensor], tuple]:
    """The state leaves of one linear-attention layer (names without the layer index) and its context:
    per state (conv initialized, recurrent initialized, has previous state, conv kernel size), record_past."""
    names, tensors, states = [], [], []
    for i in range(_states(layer)):
        conv = bool(_get(layer, "is_conv_states_initialized", i))
        recurrent = bool(_get(layer, "is_recurrent_states_initialized", i))
        if conv:
            names.append(state_name(CONV, i))
            tensors.append(_get(layer, "conv_states", i))
        if recurrent:
            names.append(state_name(RECURRENT, i))
            tensors.append(_get(layer, "recurrent_states", i))
        kernel = _get(layer, "conv_kernel_size", i) if conv or hasattr(layer, "number_of_states") else None
        states.append((conv, recurrent, bool(_get(layer, "has_previous_state", i)), kernel))
    return names, tensors, (tuple(states), bool(getattr(layer, "record_past", False)))


def fill_state_layer(layer, context, leaves) -> None:
    """Put the states back into a freshly built layer; `leaves` is an iterator over the tensors."""
    states, record_past = context
    if hasattr(layer, "record_past"):
        layer.record_past = record_past
    for i, (conv, recurrent, previous, kernel) in enumerate(states):
        for initialized, store, flag in ((conv, "conv_states", "is_conv_states_initialized"),
                                         (recurrent, "recurrent_states", "is_recurrent_states_initialized")):
            if initialized:
                tensor = next(leaves)
                _set(layer, store, i, tensor)
                _set(layer, flag, i, True)
                layer.dtype, layer.device = tensor.dtype, tensor.device
        _set(layer, "has_previous_state", i, previous)
        if kernel is not None:
            _set(layer, "conv_kernel_size", i, kernel)


# A model whose state is a plain list of tensors (RWKV's `state`: five [batch, hidden, layers] tensors) is
# captured with a `StateList`, the same list with a flattening. Leaves "0.recurrent_state",
# "0.recurrent_state_1", ...: one group, since the tensors are not per layer.
class StateList(list):
    """A list of state tensors that flattens as a cache; the model indexes and updates it as its own list."""


def rebuild_state_list(cls, context, tensors):
    return cls(tensors)


@register_cache("optimum_dynamo.flatten.states.StateList", unflatten=rebuild_state_list)
def flatten_state_list(cache):
    return [f"0.{state_name(RECURRENT, i)}" for i in range(len(cache))], list(cache), len(cache)


# ── transformers 4 ──


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def rebuild_mamba(cls, context, tensors):
    """MambaCache's constructor needs a config: set its attributes directly instead."""
    (max_batch_size, dtype, intermediate_size, ssm_state_size, conv_kernel_size), _, previous = context
    cache = cls.__new__(cls)
    if previous is not None:  # transformers 5.0-5.x's MambaCache says whether a step has run
        cache.has_previous_state = previous
    cache.max_batch_size, cache._dtype = max_batch_size, getattr(torch, dtype)
    cache.intermediate_size, cache.ssm_state_size, cache.conv_kernel_size = intermediate_size, ssm_state_size, conv_kernel_size
    cache.conv_states, cache.ssm_states = list(tensors[0::2]), list(tensors[1::2])
    return cache


def _mamba_leaves(cache):
    names = [f"{i}.{part}" for i in range(len(cache.conv_states)) for part in (CONV, RECURRENT)]
    tensors = [t for pair in zip(cache.conv_states, cache.ssm_states) for t in pair]
    sizes = (cache.max_batch_size, _dtype_name(cache._dtype), cache.intermediate_size, cache.ssm_state_size,
             cache.conv_kernel_size)
    return names, tensors, (sizes, len(cache.conv_states), getattr(cache, "has_previous_state", None))


@register_cache("transformers.models.mamba.modeling_mamba.MambaCache", unflatten=rebuild_mamba)
def flatten_mamba(cache):
    return _mamba_leaves(cache)


@register_cache("transformers.cache_utils.MambaCache", unflatten=rebuild_mamba)  # transformers < 4.54
def flatten_mamba_cache_utils(cache):
    return _mamba_leaves(cache)


@register_cache("transformers.models.falcon_mamba.modeling_falcon_mamba.FalconMambaCache", unflatten=rebuild_mamba)
def flatten_falcon_mamba(cache):
    return _mamba_leaves(cache)


# transformers 4 Mamba2: one stacked tensor per kind, [layers, batch, ...]; one leaf per layer. A rebuilt cache
# holds the leaves themselves, one per layer (`_Layers`): torch.export marks an input's dynamic axes on the tensor
# object it flattened, then flattens again to fakify it; `unbind` views, new at every flattening, would lose
# the marks and fix the batch.
class _Layers(list):
    """Per-layer states standing for the stacked tensor: indexing, `device` and `zero_` as the cache uses them."""

    @property
    def device(self):
        return self[0].device

    def zero_(self):
        for t in self:
            t.zero_()
        return self


def rebuild_mamba2(cls, context, tensors):
    scalars, layers = context
    cache = cls.__new__(cls)
    for name, (kind, value) in scalars:
        setattr(cache, name, _unscalar(kind, value))
    cache.conv_states, cache.ssm_states = _Layers(tensors[0::2]), _Layers(tensors[1::2])
    return cache


def _per_layer(states):
    return states if isinstance(states, _Layers) else states.unbind(0)


@register_cache("transformers.models.mamba2.modeling_mamba2.Mamba2Cache", unflatten=rebuild_mamba2)
def flatten_mamba2(cache):
    layers = len(cache.conv_states)
    names = [f"{i}.{part}" for i in range(layers) for part in (CONV, RECURRENT)]
    tensors = [t for pair in zip(_per_layer(cache.conv_states), _per_layer(cache.ssm_states)) for t in pair]
    return names, tensors, (_scalars(cache, {"conv_states", "ssm_states"}), layers)


# transformers 4 hybrids (Jamba, Zamba, Zamba2, Qwen3-Next): per-layer lists, attention layers in
# `key_cache`/`value_cache`, state layers in `conv_states` and `ssm_states` (Qwen3-Next:
# `recurrent_states`; Zamba2: the states in dicts by layer); the other slots hold placeholders (`[batch, 0]`
# tensors, or None), which are not leaves. Scalar attributes (block types, flags, sizes) go in the context.
_KV = (("key_cache", "key"), ("value_cache", "value"))
_MAMBA_LISTS = _KV + (("conv_states", CONV), ("ssm_states", RECURRENT))
_LINEAR_LISTS = _KV + (("conv_states", CONV), ("recurrent_states", RECURRENT))
_EMPTY, _NONE, _LEAF = 0, 1, 2  # what a slot holds


def _scalar(value):
    if isinstance(value, torch.dtype):
        return ("dtype", _dtype_name(value))
    if isinstance(value, (list, tuple)) and all(isinstance(v, (str, int, bool)) for v in value):
        return ("list", tuple(value))
    if isinstance(value, dict) and not value:
        return ("dict", ())
    if isinstance(value, (str, int, float, bool)) or value is None:
        return ("value", value)
    return None


def _scalars(cache, skip) -> tuple:
    return tuple((name, scalar) for name, value in sorted(vars(cache).items())
                 if name not in skip and (scalar := _scalar(value)) is not None)


def _unscalar(kind, value):
    return {"dtype": lambda: getattr(torch, value), "list": lambda: list(value), "dict": dict}.get(kind, lambda: value)()


def _slot(t) -> int:
    # a static test: shapes may be symbolic while exporting
    return _NONE if t is None else _LEAF if t.dim() > 2 else _EMPTY


def _rebuild_lists(lists, dicts=()):
    """`dicts`: the attributes the cache keeps as dicts by layer index."""

    def rebuild(cls, context, tensors):
        scalars, slots = context
        cache = cls.__new__(cls)
        for name, (kind, value) in scalars:
            setattr(cache, name, _unscalar(kind, value))
        batch = tensors[0].shape[0] if tensors else 0
        leaves = iter(tensors)
        built = {attr: [] for attr, _ in lists}
        for layer in slots:
            for (attr, _), slot in zip(lists, layer):
                built[attr].append(next(leaves) if slot == _LEAF else None if slot == _NONE else torch.zeros(batch, 0))
        for attr, values in built.items():
            setattr(cache, attr, dict(enumerate(values)) if attr in dicts else values)
        return cache

    return rebuild


def _list_leaves(cache, lists):
    names, tensors, slots = [], [], []
    for i in range(len(getattr(cache, lists[0][0]))):
        layer = []
        for attr, leaf in lists:
            t = getattr(cache, attr)[i]
            layer.append(_slot(t))
            if layer[-1] == _LEAF:
                names.append(f"{i}.{leaf}")
                tensors.append(t)
        slots.append(tuple(layer))
    return names, tensors, (_scalars(cache, {attr for attr, _ in lists}), tuple(slots))


@register_cache("transformers.models.jamba.modeling_jamba.HybridMambaAttentionDynamicCache",
                unflatten=_rebuild_lists(_MAMBA_LISTS))
def flatten_jamba(cache):
    return _list_leaves(cache, _MAMBA_LISTS)


@register_cache("transformers.models.bamba.modeling_bamba.HybridMambaAttentionDynamicCache",
                unflatten=_rebuild_lists(_MAMBA_LISTS))
@register_cache("transformers.models.granitemoehybrid.modeling_granitemoehybrid.HybridMambaAttentionDynamicCache",
                unflatten=_rebuild_lists(_MAMBA_LISTS))
def flatten_bamba(cache):
    return _list_leaves(cache, _MAMBA_LISTS)


@register_cache("transformers.models.zamba.modeling_zamba.ZambaHybridDynamicCache", unflatten=_rebuild_lists(_MAMBA_LISTS))
def flatten_zamba(cache):
    return _list_leaves(cache, _MAMBA_LISTS)


@register_cache("transformers.models.zamba2.modeling_zamba2.Zamba2HybridDynamicCache",
                unflatten=_rebuild_lists(_MAMBA_LISTS, dicts=("conv_states", "ssm_states")))
def flatten_zamba2(cache):
    return _list_leaves(cache, _MAMBA_LISTS)


@register_cache("transformers.models.qwen3_next.modeling_qwen3_next.Qwen3NextDynamicCache",
                unflatten=_rebuild_lists(_LINEAR_LISTS))
def flatten_qwen3_next(cache):
    return _list_leaves(cache, _LINEAR_LISTS)


# transformers 4 Falcon-H1: every layer is both (attention and mamba side by side): `conv_states` /
# `ssm_states` dicts by layer, `key_cache` / `value_cache` lists grown by `update` (empty before the prefill).
def rebuild_falcon_h1(cls, context, tensors):
    scalars, layers, with_kv = context
    cache = cls.__new__(cls)
    for name, (kind, value) in scalars:
        setattr(cache, name, _unscalar(kind, value))
    leaves = iter(tensors)
    cache.key_cache, cache.value_cache, cache.conv_states, cache.ssm_states = [], [], {}, {}
    for i in range(layers):
        if i < with_kv:
            cache.key_cache.append(next(leaves))
            cache.value_cache.append(next(leaves))
        cache.conv_states[i], cache.ssm_states[i] = next(leaves), next(leaves)
    return cache


@register_cache("transformers.models.falcon_h1.modeling_falcon_h1.FalconHybridMambaAttentionDynamicCache",
                unflatten=rebuild_falcon_h1)
def flatten_falcon_h1(cache):
    names, tensors, with_kv = [], [], len(cache.key_cache)
    for i in range(len(cache.conv_states)):
        if i < with_kv:
            names += [f"{i}.key", f"{i}.value"]
            tensors += [cache.key_cache[i], cache.value_cache[i]]
        names += [f"{i}.{CONV}", f"{i}.{RECURRENT}"]
        tensors += [cache.conv_states[i], cache.ssm_states[i]]
    skip = {"key_cache", "value_cache", "conv_states", "ssm_states"}
    return names, tensors, (_scalars(cache, skip), len(cache.conv_states), with_kv)


# transformers 4 LFM2: `conv_cache` for every layer (attention layers' stay zero and unused, not leaves),
# `key_cache`/`value_cache` grown up to the last attention layer, with `tensor([])` for conv layers.
def rebuild_lfm2(cls, context, tensors):
    scalars, slots = context
    cache = cls.__new__(cls)
    for name, (kind, value) in scalars:
        setattr(cache, name, _unscalar(kind, value))
    position, conv_shape = 0, None
    for kind, has_kv in slots:  # the shape of the first conv leaf
        if kind == "conv":
            conv_shape = tensors[position].shape
            break
        position += 2 if has_kv else 0
    leaves = iter(tensors)
    cache.conv_cache, cache.key_cache, cache.value_cache = [], [], []
    for kind, has_kv in slots:
        if kind == "conv":
            cache.conv_cache.append(next(leaves))
            if has_kv is not None:
                cache.key_cache.append(torch.tensor([]))
                cache.value_cache.append(torch.tensor([]))
        else:
            cache.conv_cache.append(torch.zeros(conv_shape, dtype=getattr(cache, "_dtype", torch.float32)))
            if has_kv is not None:
                cache.key_cache.append(next(leaves) if has_kv else torch.tensor([]))
                cache.value_cache.append(next(leaves) if has_kv else torch.tensor([]))
    return cache


@register_cache("transformers.models.lfm2.modeling_lfm2.Lfm2HybridConvCache", unflatten=rebuild_lfm2)
def flatten_lfm2(cache):
    names, tensors, slots = [], [], []
    for i, kind in enumerate(cache.layer_types):
        in_kv = i < len(cache.key_cache)  # None: past the end of key_cache
        has_kv = in_kv and cache.key_cache[i].dim() > 2
        if kind == "full_attention":
            if has_kv:
                names += [f"{i}.key", f"{i}.value"]
                tensors += [cache.key_cache[i], cache.value_cache[i]]
            slots.append(("attention", has_kv if in_kv else None))
        else:
            names.append(f"{i}.{CONV}")
            tensors.append(cache.conv_cache[i])
            slots.append(("conv", has_kv if in_kv else None))
    return names, tensors, (_scalars(cache, {"conv_cache", "key_cache", "value_cache"}), tuple(slots))

