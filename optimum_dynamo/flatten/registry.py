"""One registry: cache class <-> flat, named tensors.

A cache class is supported by one decorated flatten function::

    @register_cache("transformers.cache_utils.DynamicCache", unflatten=rebuild_dynamic)
    def flatten_dynamic(cache) -> tuple[list[str], list[Tensor], Context]: ...

`names` are leaf suffixes such as ``"0.key"``; optimum's full names are made by `naming`.
The context must be hashable, comparable and JSON-able (tuples of str/int), so that
torch.export can compare and serialize tree specs.
"""

from __future__ import annotations

import copy
import importlib
from dataclasses import dataclass
from typing import Any, Callable

import torch

Context = Any


@dataclass(frozen=True)
class CacheKind:
    path: str  # dotted path of the class
    flatten: Callable[[Any], tuple[list[str], list[torch.Tensor], Context]]
    unflatten: Callable[[type, Context, list[torch.Tensor]], Any]

    def resolve(self) -> type | None:
        """The class, or None when this transformers version does not have it."""
        module, _, name = self.path.rpartition(".")
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            return None


_KINDS: dict[str, CacheKind] = {}


def register_cache(path: str, *, unflatten: Callable[[type, Context, list[torch.Tensor]], Any]):
    """Decorator: register the flatten function of the cache class at `path`."""

    def decorator(flatten):
        _KINDS[path] = CacheKind(path, flatten, unflatten)
        return flatten

    return decorator


def kinds() -> list[CacheKind]:
    return list(_KINDS.values())


def kind_of(obj: Any) -> CacheKind | None:
    """The registered kind for `obj`'s exact class (pytree matches exact types)."""
    cls = type(obj)
    kind = _KINDS.get(f"{cls.__module__}.{cls.__name__}")
    return kind if kind is not None and kind.resolve() is cls else None


def is_cache(obj: Any) -> bool:
    return kind_of(obj) is not None


def flatten_cache(cache: Any) -> tuple[list[str], list[torch.Tensor], Context]:
    kind = kind_of(cache)
    if kind is None:
        raise TypeError(f"no flattening registered for {type(cache).__module__}.{type(cache).__name__}")
    return kind.flatten(cache)


def unflatten_cache(cls: type, context: Context, tensors: list[torch.Tensor]) -> Any:
    return _KINDS[f"{cls.__module__}.{cls.__name__}"].unflatten(cls, context, list(tensors))


def clone_cache(cache: Any) -> Any:
    """A deep copy (caches are updated in place by forward). `deepcopy` also keeps the state that is
    not a leaf, such as the tokens a sliding-window layer has seen; rebuilding from leaves is the fallback."""
    try:
        return copy.deepcopy(cache)
    except RuntimeError:  # tensors that are not graph leaves refuse deepcopy
        _, tensors, context = flatten_cache(cache)
        return unflatten_cache(type(cache), context, [t.detach().clone() for t in tensors])
