"""Centralized cache flattening: every cache class <-> flat tensors with optimum's names."""

from . import caches  # noqa: F401  (fills the registry)
from .leaves import bounded_inputs, flat_inputs, flat_outputs
from .naming import input_name, output_name
from .pytree import is_registered, register, registered, unregister
from .registry import clone_cache, flatten_cache, is_cache, kind_of, register_cache, unflatten_cache

__all__ = [
    "bounded_inputs",
    "clone_cache",
    "flat_inputs",
    "flat_outputs",
    "flatten_cache",
    "input_name",
    "is_cache",
    "is_registered",
    "kind_of",
    "output_name",
    "register",
    "register_cache",
    "registered",
    "unflatten_cache",
    "unregister",
]
