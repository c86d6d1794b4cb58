"""Record every forward call of one or more modules: kwargs in, outputs out.

    with observe(model) as obs:
        model.generate(**inputs)
    obs.calls  # [Call(kwargs=..., outputs=...), ...]

Positional arguments are stored by parameter name. Tensors and caches are copied when the
call happens (caches are updated in place by later calls).
"""

from __future__ import annotations

import inspect
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Iterator

import torch

from ..flatten import clone_cache, is_cache


def snapshot(value: Any) -> Any:
    """A copy of `value` that later in-place updates cannot change."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if is_cache(value):
        return clone_cache(value)
    if isinstance(value, dict):  # includes transformers' ModelOutput (keyword constructor)
        return type(value)(**{k: snapshot(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(snapshot(v) for v in value)
    return value


@dataclass
class Call:
    kwargs: dict[str, Any]
    outputs: Any = None
    positional: int = 0  # how many arguments came by position (the first ones of `kwargs`)
    seconds: float = 0.0  # time spent in the call


@dataclass
class InputObserver:
    """Hooks `module.forward` (or wraps another `method`); a context manager. `max_calls=None` keeps every call."""

    module: torch.nn.Module
    name: str = "model"
    max_calls: int | None = None
    calls: list[Call] = field(default_factory=list)
    dropped: int = 0
    method: str = "forward"
    _handles: list = field(default_factory=list, repr=False)
    _pending: list = field(default_factory=list, repr=False)

    def __post_init__(self):
        self._signature = inspect.signature(getattr(self.module, self.method))

    def _pre_hook(self, module, args, kwargs):
        bound = self._signature.bind_partial(*args, **kwargs)
        named = {}
        for key, value in bound.arguments.items():
            param = self._signature.parameters[key]
            if param.kind is param.VAR_KEYWORD:
                named.update(value)
            elif param.kind is not param.VAR_POSITIONAL:
                named[key] = value
        self._pending.append((snapshot(named), len(args), time.perf_counter()))

    def _hook(self, module, args, kwargs, output):
        named, positional, start = self._pending.pop()
        seconds = time.perf_counter() - start
        if self.max_calls is not None and len(self.calls) >= self.max_calls:
            self.dropped += 1
            return
        self.calls.append(Call(named, snapshot(output), positional, seconds))

    def _wrapped(self, method):
        def recorded(*args, **kwargs):
            self._pre_hook(self.module, args, kwargs)
            output = method(*args, **kwargs)
            self._hook(self.module, args, kwargs, output)
            return output

        recorded.__signature__ = self._signature  # callers may inspect it (generate inspects forward)
        return recorded

    def __enter__(self) -> InputObserver:
        if self.method == "forward":
            self._handles = [
                self.module.register_forward_pre_hook(self._pre_hook, with_kwargs=True),
                self.module.register_forward_hook(self._hook, with_kwargs=True),
            ]
        else:
            own = self.method in vars(self.module)
            method = getattr(self.module, self.method)
            setattr(self.module, self.method, self._wrapped(method))
            restore = (lambda: setattr(self.module, self.method, method)) if own else (lambda: delattr(self.module, self.method))
            self._handles = [SimpleNamespace(remove=restore)]
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._pending.clear()

    def summary(self) -> str:
        text = f"{self.name}: {len(self.calls)} calls recorded"
        return text + (f", {self.dropped} dropped (max_calls={self.max_calls})" if self.dropped else "")


@contextmanager
def observe(*modules: torch.nn.Module, **named: torch.nn.Module) -> Iterator[Any]:
    """Observe one module (yields its observer) or several (yields a dict by name)."""
    observers = {f"module{i}": InputObserver(m, f"module{i}") for i, m in enumerate(modules)}
    observers.update({name: InputObserver(m, name) for name, m in named.items()})
    for obs in observers.values():
        obs.__enter__()
    try:
        yield next(iter(observers.values())) if len(observers) == 1 else observers
    finally:
        for obs in observers.values():
            obs.__exit__(None, None, None)
