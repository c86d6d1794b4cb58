"""What the installed transformers calls a model's cache: the one place that knows.

transformers 5.24 renamed the cache argument of every model's `forward`, of `generate` and of
`prepare_inputs_for_generation` — `past_key_values`, and Mamba-style models' `cache_params` — to `cache`, and
the field of every output class likewise (the old names still work, with a warning, until 5.40). RWKV keeps
its `state`. Everything else asks this module: `name()` to pass a cache by keyword, `renamed()` to translate
a parameter written with an old name, `of(output)` to read a cache out of an output, whatever it is called.
"""

from __future__ import annotations

RENAMED_IN = "5.24.0"
RENAMED = ("past_key_values", "cache_params")  # the names 5.24 replaced by `cache`
NAMES = ("cache", *RENAMED, "state")  # every name a transformers release gives a model's cache or state

_current: list[str] = []


def name() -> str:
    """`cache` on transformers >= 5.24, else `past_key_values` (read once, when first asked)."""
    if not _current:
        import importlib.metadata

        from packaging.version import Version

        installed = Version(importlib.metadata.version("transformers"))
        _current.append("cache" if installed >= Version(RENAMED_IN) else "past_key_values")
    return _current[0]


def renamed(parameter: str) -> str:
    """A parameter as the installed transformers spells it (`past_key_values` -> `cache` on 5.24+)."""
    return "cache" if parameter in RENAMED and name() == "cache" else parameter


def parameter(params) -> str | None:
    """The cache parameter among a forward's `params` (names), if it takes one."""
    return next((n for n in NAMES if n in params), None)


def of(output):
    """The cache an output (a ModelOutput, or a dict of a model's outputs) carries, under any name; else None.
    The legacy tuples that transformers < 4.54 models return when called without a cache come as their class."""
    for field in NAMES:
        value = output.get(field) if isinstance(output, dict) else None
        if value is not None:
            return _from_legacy(value)
    return None


def _from_legacy(value):
    """Per-layer tuples of tensors ((key, value) or (key, value, cross key, cross value)) as the cache class they
    stand for; anything else (a cache object, a state model's list of tensors) as it is."""
    if not (isinstance(value, tuple) and value and all(isinstance(layer, tuple) for layer in value)):
        return value
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache

    cls = EncoderDecoderCache if len(value[0]) == 4 else DynamicCache
    return cls.from_legacy_cache(value)


def spelled_before(forward):
    """A model's bound `forward` as transformers < 5.24 spelled it: its signature and its output fields say
    `past_key_values` where the installed one says `cache` (for code written against the old names, such as
    optimum-onnx's torchscript export, which matches its dummy inputs and its outputs by name). A decorated forward's
    `__wrapped__` (which optimum's patcher unwraps, to trace transformers' output capture its own way) is spelled so
    too."""
    import inspect

    if "cache" not in inspect.signature(forward).parameters:
        return forward
    spelled = _old_names(forward)
    inner = getattr(forward, "__wrapped__", None)
    if inner is not None:
        spelled.__wrapped__ = _old_names(inner)
    return spelled


def _old_names(fn):
    """`fn` (whose signature says `cache`) taking `past_key_values` and returning it under that name; no
    `__wrapped__` of its own."""
    import functools
    import inspect

    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def old_names(*args, **kwargs):
        if "past_key_values" in kwargs:
            kwargs["cache"] = kwargs.pop("past_key_values")
        out = fn(*args, **kwargs)
        return {("past_key_values" if k == "cache" else k): v for k, v in out.items()} if isinstance(out, dict) else out

    del old_names.__wrapped__
    old_names.__signature__ = signature.replace(parameters=[
        p.replace(name="past_key_values") if p.name == "cache" else p for p in signature.parameters.values()])
    return old_names
