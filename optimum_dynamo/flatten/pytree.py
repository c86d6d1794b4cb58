"""Reversible registration of the cache registry with torch.utils._pytree and optree.

torch's `register_pytree_node` also registers in optree's "torch" namespace, which is what
torch.export, torch.onnx and `torch.utils._cxx_pytree` use; the FX flatten spec (used by
`ExportedProgram.module()`) is set too. A registration that existed before (transformers < 4.54 at
import, its executorch helper, onnx-diagnostic) is put back on exit.
"""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager

import optree
import torch.fx._pytree as fx_pytree
import torch.utils._cxx_pytree  # noqa: F401  (so registration reaches optree at once)
import torch.utils._pytree as pytree

from .registry import flatten_cache, kinds, unflatten_cache

_LOCK = threading.RLock()
_depth = 0
_saved: dict[type, tuple] = {}


def _node_fns(cls):
    def flatten(obj):
        names, tensors, context = flatten_cache(obj)
        return tensors, (tuple(names), context)

    def flatten_with_keys(obj):
        names, tensors, context = flatten_cache(obj)
        return [(pytree.MappingKey(n), t) for n, t in zip(names, tensors)], (tuple(names), context)

    def unflatten(values, context):
        return unflatten_cache(cls, context[1], list(values))

    return flatten, flatten_with_keys, unflatten


def _tuples(value):
    """JSON gives lists back; contexts are compared as tuples."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _dump_context(context) -> str:
    return json.dumps(context)


def _load_context(text: str):
    return _tuples(json.loads(text))


def _remove(cls) -> tuple | None:
    """Deregister `cls` everywhere; return what was there so it can be restored."""
    fx_spec = (fx_pytree.SUPPORTED_NODES.pop(cls, None), fx_pytree.SUPPORTED_NODES_EXACT_MATCH.pop(cls, None))
    if cls not in pytree.SUPPORTED_NODES:
        return None if fx_spec[0] is None else (None, None, fx_spec)
    node = pytree.SUPPORTED_NODES[cls]
    serialized = pytree.SUPPORTED_SERIALIZED_TYPES[cls]
    pytree._deregister_pytree_node(cls)
    try:
        optree.unregister_pytree_node(cls, namespace="torch")
    except ValueError:
        pass
    return node, serialized, fx_spec


def _add(cls, flatten, unflatten, flatten_with_keys, serialized_type_name, to_ctx=None, from_ctx=None):
    pytree.register_pytree_node(
        cls,
        flatten,
        unflatten,
        serialized_type_name=serialized_type_name,
        flatten_with_keys_fn=flatten_with_keys,
        to_dumpable_context=to_ctx,
        from_dumpable_context=from_ctx,
    )


def register() -> None:
    """Register every known cache class (nested calls are counted)."""
    global _depth
    with _LOCK:
        _depth += 1
        if _depth > 1:
            return
        for kind in kinds():
            cls = kind.resolve()
            if cls is None or cls in _saved:  # transformers 5: SlidingWindowCache is StaticCache (one class, two names)
                continue
            _saved[cls] = _remove(cls)
            flatten, flatten_with_keys, unflatten = _node_fns(cls)
            _add(cls, flatten, unflatten, flatten_with_keys, f"optimum_dynamo:{kind.path}", _dump_context, _load_context)
            fx_pytree.register_pytree_flatten_spec(cls, lambda obj, spec: flatten_cache(obj)[1])


def unregister() -> None:
    global _depth
    with _LOCK:
        if _depth == 0:
            return
        _depth -= 1
        if _depth > 0:
            return
        for cls, previous in _saved.items():
            _remove(cls)
            if previous is None:
                continue
            node, serialized, fx_spec = previous
            if fx_spec[0] is not None:
                fx_pytree.register_pytree_flatten_spec(cls, *fx_spec)
            if node is not None:
                _add(
                    cls,
                    node.flatten_fn,
                    node.unflatten_fn,
                    node.flatten_with_keys_fn,
                    serialized.serialized_type_name,
                    serialized.to_dumpable_context,
                    serialized.from_dumpable_context,
                )
        _saved.clear()


@contextmanager
def registered():
    """Cache classes are pytree nodes inside this block, and as before after it."""
    register()
    try:
        yield
    finally:
        unregister()


def is_registered(cls) -> bool:
    return cls in pytree.SUPPORTED_NODES
