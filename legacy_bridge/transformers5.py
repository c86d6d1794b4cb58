"""Names optimum-onnx 0.1.0 needs from transformers < 5, restored on transformers >= 5.

Each entry puts a name back only when it is missing, so on transformers 4 nothing is replaced.
Entries are applied right after their module is imported (see `_hooks`), so `install()` imports nothing.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from ._hooks import when_imported


@dataclass(frozen=True)
class Shim:
    module: str  # where optimum-onnx looks for the name
    attr: str  # dotted path inside the module ("Class.method" allowed)
    removed_in: str  # first transformers version without it
    make: Callable[[object], object]  # module -> value; called only when the name is missing


def _attr(module: str, name: str) -> Callable[[object], object]:
    return lambda _: getattr(importlib.import_module(module), name)


def _parameter_dtype(module):
    """First floating-point parameter dtype, else the last parameter dtype (None without parameters)."""
    dtype = None
    for param in module.parameters():
        dtype = param.dtype
        if param.is_floating_point():
            return dtype
    return dtype


class _ByClassName:
    """The 5.x output-capture registry seen as the 4.x dict keyed by `str(model_class)`."""

    def __init__(self, registry: dict):
        self._registry = registry

    def get(self, key, default=None):
        return dict.get(self._registry, key, default)

    def __getitem__(self, key):
        return dict.__getitem__(self._registry, key)

    def __contains__(self, key):
        return dict.__contains__(self._registry, key)


def _can_record_registry():
    registry = importlib.import_module("transformers.utils.output_capturing")._CAN_RECORD_REGISTRY
    # 5.2-5.x: a plain dict keyed by class name; later its `get` takes a model, not the name optimum passes.
    return registry if type(registry).get is dict.get else _ByClassName(registry)


SHIMS = [
    Shim("transformers.modeling_utils", "get_parameter_dtype", "5.0.0", lambda _: _parameter_dtype),
    Shim("transformers.utils", "is_offline_mode", "5.0.0", _attr("huggingface_hub", "is_offline_mode")),
    Shim("transformers.utils.generic", "_CAN_RECORD_REGISTRY", "5.2.0", lambda _: _can_record_registry()),
    Shim("transformers.utils.generic", "OutputRecorder", "5.2.0", _attr("transformers.utils.output_capturing", "OutputRecorder")),
    # optimum's ORTModelForCausalLM._from_pretrained; 5.x configs hold no generation parameters but may report strays
    Shim("transformers.configuration_utils", "PretrainedConfig._get_non_default_generation_parameters", "5.0.0",
         lambda module: module.PretrainedConfig._get_generation_parameters),
]

applied: list[Shim] = []  # shims that actually set a name, in order


def _owner(module, dotted: str):
    *path, name = dotted.split(".")
    owner = module
    for part in path:
        owner = getattr(owner, part)
    return owner, name


def _apply(shim: Shim, module) -> None:
    owner, name = _owner(module, shim.attr)
    if hasattr(owner, name):
        return
    setattr(owner, name, shim.make(module))
    applied.append(shim)


_installed = False


def install() -> None:
    global _installed
    if _installed:
        return
    _installed = True
    for shim in SHIMS:
        when_imported(shim.module, lambda module, shim=shim: _apply(shim, module))
