"""Let optimum-onnx 0.1.0 (written for transformers < 4.58) import and run on transformers 5.

One table of small entries. Each is applied right after its module is imported (see `hooks`), only when
the installed transformers is at least `since`, and, unless `replace` is set, only when the name is missing.
So `install()` imports nothing (it runs at interpreter start-up: nothing but `sys` is
imported until a watched module is), and on transformers 4 nothing is touched.
"""

from __future__ import annotations

import logging
import sys

from .hooks import when_imported

logger = logging.getLogger(f"optimum_dynamo.{__name__}")  # one hierarchy with the package's


class Shim:
    """One entry (a plain class: `dataclasses` costs start-up time)."""

    __slots__ = ("module", "attr", "since", "make", "replace", "trigger")

    def __init__(self, module: str, attr: str, since: str, make, replace: bool = False, trigger: str | None = None):
        self.module = module  # module that holds the name (where optimum looks for it)
        self.attr = attr  # dotted path inside the module ("Class.method" allowed)
        self.since = since  # first transformers version that removed the name, or started to need the change
        self.make = make  # module -> new value
        self.replace = replace  # overwrite an existing name (otherwise only fill a missing one)
        self.trigger = trigger  # apply right before and after this module runs, not at `module`'s import


def _import(name: str):
    import importlib

    return importlib.import_module(name)


def _attr(module: str, name: str):
    return lambda _: getattr(_import(module), name)


def _traced_length(module: str, name: str):
    """transformers' mask function `name`; on transformers 5.4 to 5.12, which read a tensor `q_length` as the old
    `cache_position` (a 1-d tensor of positions) and fail on a 0-d one, one taking the 0-d tensor torchscript's tracer
    makes of the length as the positions it stands for."""
    import functools

    import torch
    from packaging.version import Version

    function = getattr(_import(module), name)
    if not Version("5.4") <= _transformers_version() < Version("5.13"):
        return function

    @functools.wraps(function)
    def mask(*args, **kwargs):
        length = kwargs.get("q_length")
        if isinstance(length, torch.Tensor) and length.dim() == 0:
            kwargs["q_length"] = torch.arange(length, device=length.device) + kwargs.get("q_offset", 0)
        return function(*args, **kwargs)

    return mask


def _parameter_dtype(module):
    """First floating-point parameter dtype, else the last parameter dtype (None without parameters)."""
    dtype = None
    for param in module.parameters():
        dtype = param.dtype
        if param.is_floating_point():
            return dtype
    return dtype


class _ByClassName:
    """The 5.x output-capture registry read as the 4.x dict keyed by `str(model_class)`."""

    def __init__(self, registry: dict):
        self._registry = registry

    def get(self, key, default=None):
        return dict.get(self._registry, key, default)

    def __getitem__(self, key):
        return dict.__getitem__(self._registry, key)

    def __contains__(self, key):
        return dict.__contains__(self._registry, key)


def _can_record_registry(_):
    registry = _import("transformers.utils.output_capturing")._CAN_RECORD_REGISTRY
    # A plain dict keyed by class name in 5.2; later its `get` takes a model instead of the name optimum passes.
    return registry if type(registry).get is dict.get else _ByClassName(registry)


def _from_legacy_cache(cls, past_key_values):
    return cls(list(past_key_values))  # 5.x constructors take the per-layer tuples directly


def _to_legacy_cache(cache):
    if hasattr(cache, "self_attention_cache"):  # EncoderDecoderCache: (self k, self v, cross k, cross v) per layer
        own, cross = cache.self_attention_cache.to_legacy_cache(), cache.cross_attention_cache.to_legacy_cache()
        return tuple(a + b for a, b in zip(own, cross)) if cross else own
    return tuple((layer.keys, layer.values) for layer in cache.layers)


def _fill_attention_mask(forward):
    """ORTModelForCausalLM.forward that builds an all-ones mask when the session wants one and none is given."""
    import functools

    @functools.wraps(forward)
    def wrapper(self, input_ids, attention_mask=None, past_key_values=None, *args, **kwargs):
        if attention_mask is None and "attention_mask" in self.input_names and hasattr(input_ids, "new_ones"):
            past = 0
            if past_key_values is not None:  # same past-length rule as optimum's forward
                fused = getattr(self, "old_gpt_bigcode_modeling", False)
                past = (past_key_values[0] if fused else past_key_values[0][1]).shape[-2]
            attention_mask = input_ids.new_ones((input_ids.shape[0], past + input_ids.shape[1]))
        return forward(self, input_ids, attention_mask, past_key_values, *args, **kwargs)

    return wrapper


def _cache_keyword(call):
    """optimum's `ORTSessionMixin.__call__` (every ORT model's) handing a forward written with `past_key_values` the
    cache that transformers' generate passes as `cache=` since 5.24 (a forward that takes `cache` gets it as is)."""
    import functools
    import inspect

    takes = {}

    @functools.wraps(call)
    def wrapper(self, *args, **kwargs):
        if "cache" in kwargs:
            cls = type(self)
            if cls not in takes:
                takes[cls] = "cache" in inspect.signature(cls.forward).parameters
            if not takes[cls]:
                kwargs["past_key_values"] = kwargs.pop("cache")
        return call(self, *args, **kwargs)

    return wrapper


def _old_names_init(init):
    """optimum's `ModelPatcher.__init__` (torchscript export and its validation) over the model's forward as spelled
    before 5.24: optimum-onnx's configs name the cache `past_key_values`, in (dummy inputs, input order) and out."""
    import functools

    from .cache_argument import spelled_before

    @functools.wraps(init)
    def __init__(self, config, model, *args, **kwargs):
        forward = getattr(model, "forward", None)
        spelled = spelled_before(forward) if forward is not None else None
        if spelled is not forward:
            self.forward_before_rename = vars(model).get("forward")  # an instance attribute, if any
            model.forward = spelled
        init(self, config, model, *args, **kwargs)

    return __init__


def _old_names_exit(exit_):
    """`ModelPatcher.__exit__` putting back the forward `_old_names_init` replaced."""
    import functools

    @functools.wraps(exit_)
    def __exit__(self, *exc):
        exit_(self, *exc)
        if hasattr(self, "forward_before_rename"):
            if self.forward_before_rename is None:
                vars(self._model).pop("forward", None)
            else:
                self._model.forward = self.forward_before_rename

    return __exit__


def _layer_update(update):
    """optimum's traceable `DynamicLayer.update` taking what a 5.24 cache passes its layers (`kwargs=`)."""
    return lambda self, key_states, value_states, *args, **kwargs: update(self, key_states, value_states)


_TF = "transformers"
_ORT = "optimum.onnxruntime.modeling_decoder"
_ORT_S2S = "optimum.onnxruntime.modeling_seq2seq"
_PATCHER = "optimum.exporters.onnx.model_patcher"

SHIMS = [
    # Imports of optimum.exporters.onnx and optimum.onnxruntime.
    Shim(f"{_TF}.modeling_utils", "get_parameter_dtype", "5.0.0", lambda _: _parameter_dtype),
    Shim(f"{_TF}.utils", "is_offline_mode", "5.0.0", _attr("huggingface_hub", "is_offline_mode")),
    Shim(f"{_TF}.utils.generic", "_CAN_RECORD_REGISTRY", "5.2.0", _can_record_registry),
    Shim(f"{_TF}.utils.generic", "OutputRecorder", "5.2.0", _attr(f"{_TF}.utils.output_capturing", "OutputRecorder")),
    # optimum.onnxruntime.modeling_seq2seq imports AutoModelForVision2Seq, renamed AutoModelForImageTextToText in 5.0.
    # Set when transformers is imported and again right before modeling_seq2seq runs: transformers 5 replaces
    # its lazy module object in sys.modules after a model is built, and the new one lacks the name.
    Shim(_TF, "AutoModelForVision2Seq", "5.0.0", _attr(_TF, "AutoModelForImageTextToText")),
    Shim(_TF, "AutoModelForVision2Seq", "5.0.0", _attr(_TF, "AutoModelForImageTextToText"), replace=True,
         trigger="optimum.onnxruntime.modeling_seq2seq"),
    Shim(_TF, "AutoModelForVision2Seq", "5.0.0", _attr(_TF, "AutoModelForImageTextToText"), replace=True,
         trigger="optimum.onnxruntime"),
    # ORTModelForCausalLM.from_pretrained / generate. Configs hold no generation parameters since 5.0.
    Shim(f"{_TF}.configuration_utils", "PretrainedConfig._get_non_default_generation_parameters", "5.0.0",
         lambda m: m.PretrainedConfig._get_generation_parameters),
    Shim(_ORT, "ORTModelForCausalLM.is_remote_code", "5.4.0", lambda _: classmethod(lambda cls: False)),
    # The next two appeared between 5.13 (absent) and 5.18 (present). An ONNX session has no torch experts.
    Shim(_ORT, "ORTModelForCausalLM.get_experts_implementation", "5.14.0", lambda _: lambda self: {}),
    # The same two for encoder-decoder runtimes (ORTModelForSeq2SeqLM, ...ForSpeechSeq2Seq, ...ForVision2Seq).
    Shim(_ORT_S2S, "ORTModelForConditionalGeneration.is_remote_code", "5.4.0", lambda _: classmethod(lambda cls: False)),
    Shim(_ORT_S2S, "ORTModelForConditionalGeneration.get_experts_implementation", "5.14.0", lambda _: lambda self: {}),
    # generate() drops an all-ones attention_mask; ORT sessions exported with one still require it.
    Shim(_ORT, "ORTModelForCausalLM.forward", "5.14.0", lambda m: _fill_attention_mask(m.ORTModelForCausalLM.forward),
         replace=True),
    # generate() hands the cache over as `cache=` since 5.24; optimum's forwards take `past_key_values`.
    Shim("optimum.onnxruntime.base", "ORTSessionMixin.__call__", "5.24.0",
         lambda m: _cache_keyword(m.ORTSessionMixin.__call__), replace=True),
    # Torchscript export: optimum-onnx's configs name the cache `past_key_values`, in and out.
    Shim(_PATCHER, "ModelPatcher.__init__", "5.24.0", lambda m: _old_names_init(m.ModelPatcher.__init__), replace=True),
    Shim(_PATCHER, "ModelPatcher.__exit__", "5.24.0", lambda m: _old_names_exit(m.ModelPatcher.__exit__), replace=True),
    Shim(_PATCHER, "patched_dynamic_layer_update", "5.24.0", lambda m: _layer_update(m.patched_dynamic_layer_update),
         replace=True),
    # Torchscript export (model_patcher) turns caches into tuples and back.
    Shim(f"{_TF}.cache_utils", "DynamicCache.from_legacy_cache", "5.0.0", lambda _: classmethod(_from_legacy_cache)),
    Shim(f"{_TF}.cache_utils", "DynamicCache.to_legacy_cache", "5.0.0", lambda _: _to_legacy_cache),
    Shim(f"{_TF}.cache_utils", "EncoderDecoderCache.from_legacy_cache", "5.0.0", lambda _: classmethod(_from_legacy_cache)),
    Shim(f"{_TF}.cache_utils", "EncoderDecoderCache.to_legacy_cache", "5.0.0", lambda _: _to_legacy_cache),
    # optimum registers vmap-free mask functions written for transformers 4 (`prepare_padding_mask(_slice=)`, gone
    # in 5.0; the `cache_position` signature, replaced by `q_length`/`q_offset` in 5.4); transformers 5's own
    # functions no longer use vmap by default, so register those.
    Shim(_PATCHER, "sdpa_mask_without_vmap", "5.0.0", lambda _: _traced_length(f"{_TF}.masking_utils", "sdpa_mask"),
         replace=True),
    Shim(_PATCHER, "eager_mask_without_vmap", "5.0.0", lambda _: _traced_length(f"{_TF}.masking_utils", "eager_mask"),
         replace=True),
]

applied: list[Shim] = []  # entries that changed something, in order
_made: dict[Shim, object] = {}  # what each entry set last
_MISSING = object()


_version_checked: dict[str, bool] = {}


def _transformers_version():
    """The installed transformers' Version."""
    import importlib.metadata

    from packaging.version import Version

    return Version(importlib.metadata.version("transformers"))


def _due(shim: Shim) -> bool:
    """Whether the installed transformers is at least `shim.since` (read when a watched module is imported)."""
    if shim.since not in _version_checked:
        from packaging.version import Version

        _version_checked[shim.since] = _transformers_version() >= Version(shim.since)
    return _version_checked[shim.since]


def _apply(shim: Shim, module) -> None:
    if not _due(shim):
        return
    module = sys.modules.get(shim.module, module)  # `transformers` replaces itself by a lazy module when imported
    *path, name = shim.attr.split(".")
    owner = module
    for part in path:
        owner = getattr(owner, part, None)
    if owner is None:  # the class itself is gone: leave the import alone
        logger.warning("legacy_bridge: cannot apply %s.%s", shim.module, shim.attr)
        return
    current = getattr(owner, name, _MISSING)
    if shim in _made and current is _made[shim]:  # set by this entry already (a replacement is not wrapped twice)
        return
    if shim.replace or current is _MISSING:
        try:
            value = shim.make(module)
        except AttributeError:  # what a replacement wraps is gone in this optimum version: leave the import alone
            logger.warning("legacy_bridge: cannot apply %s.%s", shim.module, shim.attr)
            return
        _made[shim] = value
        setattr(owner, name, value)
        applied.append(shim)


def reapply() -> None:
    """Apply the applied entries again to the modules now in sys.modules (transformers 5 replaces its lazy
    module object after a model is built; optimum resolves auto classes on it by name)."""
    for shim in list(dict.fromkeys(applied)):
        if shim.module in sys.modules:
            _apply(shim, sys.modules[shim.module])


_installed = False


def install() -> None:
    global _installed
    if _installed:
        return
    _installed = True
    for shim in SHIMS:
        if shim.trigger:
            for before in (True, False):
                when_imported(shim.trigger, lambda _, shim=shim: _apply(shim, _import(shim.module)),
                              before=before)
        else:
            when_imported(shim.module, lambda module, shim=shim: _apply(shim, module))
