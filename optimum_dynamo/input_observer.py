"""`torch.onnx.InputObserver`'s API on this package's capture: a drop-in replacement.

    observer = InputObserver()
    with observer(model):
        model.generate(**inputs)
    ep = torch.export.export(model, (), kwargs=observer.infer_arguments(),
                             dynamic_shapes=observer.infer_dynamic_shapes())

Calls are recorded by `capture.InputObserver` and inferred by `capture.infer_arguments`: caches are
flattened by `flatten` (an empty cache at prefill is a missing input, filled empty), and the cache classes
stay registered as pytree nodes while this observer lives, so the export needs nothing more.
"""

from __future__ import annotations

import inspect
import logging
import time
import weakref
from contextlib import contextmanager
from typing import Any, Callable

import torch

from . import flatten
from .capture import Call, CaptureError, ExportArguments, infer_arguments
from .capture import InputObserver as Recorder
from .flatten import flat_inputs, flat_outputs, flatten_cache, is_cache, unflatten_cache
from .validate import substitute_missing
from .validate.report import rebuild_kwargs

logger = logging.getLogger(__name__)


class InputObserver:
    """Records the calls of a model's method; infers the arguments and dynamic shapes to export it.
    `value_if_missing`: values (by name or position) for arguments some calls lack, e.g. `pixel_values`
    given at prefill only; they serve the inference, the model never runs on them."""

    def __init__(self, value_if_missing: dict[str | int, Any] | None = None):
        self.value_if_missing = dict(value_if_missing or {})
        self._recorder: Recorder | None = None
        self._registered = False
        self._inferred: dict[tuple, ExportArguments] = {}
        self._completed: tuple[int, list[Call]] = (0, [])  # `_calls()` for that many recorded calls

    @contextmanager
    def __call__(self, model: torch.nn.Module, store_n_calls: int = 3, method_name: str = "forward"):
        """Record the first `store_n_calls` calls of `model.<method_name>` inside the block."""
        if not hasattr(model, method_name):
            raise ValueError(f"Model type {model} does not have a method {method_name!r}.")
        calls = self._recorder.calls if self._recorder else []
        recorder = Recorder(model, type(model).__name__, len(calls) + store_n_calls, calls, method=method_name)
        self._recorder = recorder
        self._check_missing()
        with recorder:
            yield self

    def num_obs(self) -> int:
        return len(self._recorder.calls) if self._recorder else 0

    def infer_dynamic_shapes(
        self, set_batch_dimension_for: set[int | str] | bool | None = None
    ) -> tuple[dict[int, Any] | None, ...] | dict[str, dict[int, Any] | None]:
        """Dynamic shapes for `torch.export.export`. By default batch axes are dynamic even when every call
        had one batch size (`capture` rules); a set or a bool follows torch's: axis 0 of the named (or
        positional) inputs, of all of them (True), of none (False or an empty set) beyond the varying axes."""
        self._register()
        if set_batch_dimension_for is None:
            return self._structured(self._arguments().dynamic_shapes)
        args = self._arguments(dynamic_batch=False)
        shapes = dict(args.dynamic_shapes)
        inputs = {k for k, v in args.kwargs.items() if not _plain(v)}
        if set_batch_dimension_for is True:
            chosen = inputs
        else:
            chosen = {self._name(k) for k in (set_batch_dimension_for or ())}
        for name in chosen & inputs:
            value = shapes[name]
            if isinstance(value, list):
                shapes[name] = [{0: torch.export.Dim.DYNAMIC, **leaf} for leaf in value]
            else:
                shapes[name] = {0: torch.export.Dim.DYNAMIC, **(value or {})}
        return self._structured(shapes)

    def infer_arguments(
        self,
        index_or_args_or_kwargs: tuple[Any] | dict[str, Any] | int | None = None,
        flat: bool = False,
        as_args_kwargs: bool = False,
    ) -> Any:
        """A sample for `torch.export.export`: by default one where every dynamic axis is >= 2 (a recorded
        call, grown when none is); or call `i`, or the given args/kwargs, completed with empty values."""
        self._register()
        args = self._arguments()
        if index_or_args_or_kwargs is None:
            kwargs = args.kwargs
        else:
            kwargs = rebuild_kwargs(self._filled(self._call(index_or_args_or_kwargs), args), args)
        if flat:
            values = flat_inputs(kwargs, list(kwargs))
            return [values[n] for n in args.input_names]
        structured = self._structured(kwargs)
        if not as_args_kwargs:
            return structured
        return (structured, {}) if isinstance(structured, tuple) else ((), structured)

    def check_discrepancies(
        self,
        onnx_program: torch.onnx.ONNXProgram,
        atol: float = 1e-4,
        rtol: float = 0.1,
        progress_bar: bool = False,
        initializer: Callable | None = None,
        skip_none: bool = True,
    ) -> list[dict[str, str | int | float | bool]]:
        """Run the ONNX program on every recorded call (missing inputs filled empty) and compare with the
        recorded outputs: one row per call, as torch's (`initializer=None`: the program's default session)."""
        self._check_captured()
        onnx_program.initialize_inference_session(*([initializer] if initializer else []))
        names = [i.name for i in onnx_program.model.graph.inputs]
        calls = self._calls()
        if progress_bar:
            from tqdm import tqdm

            calls = tqdm(calls)
        rows = []
        for index, call in enumerate(calls):
            feeds = self.infer_arguments(index, flat=True)
            if len(feeds) != len(names):
                raise RuntimeError(f"There are ({len(feeds)}) tensors but the model expects {len(names)}.")
            start = time.perf_counter()
            try:
                got, error = onnx_program(**dict(zip(names, feeds))), None
            except Exception as e:  # reported in the row, as torch's does
                got, error = None, str(e)
            row = dict(error=error, SUCCESS=False) if error else _compare(
                list(flat_outputs(call.outputs).values()), got, atol, rtol, skip_none)
            row.update(index=index, duration_torch=call.seconds, ort_duration=time.perf_counter() - start,
                       n_inputs=len(names), n_none=0, n_empty=sum(t.numel() == 0 for t in feeds))
            rows.append(row)
        onnx_program.release()
        return rows

    # ── inference over the recorded calls ──
    def _check_captured(self) -> None:
        if not self.num_obs():
            raise RuntimeError("No inputs were captured.")

    def _parameters(self) -> dict[str, inspect.Parameter]:
        return dict(inspect.signature(getattr(self._recorder.module, self._recorder.method)).parameters)

    def _keywords(self) -> str | None:
        """The name of the method's `**kwargs`, if any."""
        return next((n for n, p in self._parameters().items() if p.kind is p.VAR_KEYWORD), None)

    def _name(self, key: str | int) -> str:
        return list(self._parameters())[key] if isinstance(key, int) else key

    def _check_missing(self) -> None:
        names = list(self._parameters())
        for key in self.value_if_missing:
            if isinstance(key, int) and key >= len(names) or isinstance(key, str) and key not in names and not self._keywords():
                raise ValueError(f"Unexpected keyword argument {key!r} provided as a value_if_missing input for a "
                                 f"function that does not accept it: {tuple(names)}.")
            if not isinstance(key, (int, str)):
                raise TypeError(f"Unexpected type {type(key)} for a missing value. The key is {key!r}.")

    def _calls(self) -> list[Call]:
        """The recorded calls, each argument it lacks taken from `value_if_missing`."""
        self._check_captured()
        if self._completed[0] != self.num_obs():  # made once per recording (caches are flattened to complete them)
            fill = {self._name(k): v for k, v in self.value_if_missing.items()}
            calls = [Call({**c.kwargs, **{k: v for k, v in fill.items() if c.kwargs.get(k) is None}}, c.outputs,
                          c.positional, c.seconds) for c in self._recorder.calls]
            self._completed = (self.num_obs(), _structured_empty_caches(calls))
        return self._completed[1]

    def _inputs(self) -> list[str]:
        """Tensor and cache arguments, in the method's order (those caught by `**kwargs` last)."""
        seen = {k: None for c in self._calls() for k, v in c.kwargs.items() if isinstance(v, torch.Tensor) or is_cache(v)}
        params = self._parameters()
        return [p for p in params if p in seen] + [k for k in seen if k not in params]

    def _constants(self, inputs: list[str]) -> dict[str, Any]:
        """Named parameters given the same plain value, not their default, in every call."""
        calls, params = self._calls(), self._parameters()
        constants = {}
        for key, value in calls[0].kwargs.items():
            if key in inputs or key not in params or not isinstance(value, (bool, int, float, str)):
                continue
            if value != params[key].default and all(c.kwargs.get(key, object()) == value for c in calls):
                constants[key] = value
        return constants

    def _arguments(self, dynamic_batch: bool = True) -> ExportArguments:
        key = (self.num_obs(), dynamic_batch)
        if key not in self._inferred:
            calls, inputs = self._calls(), self._inputs()
            try:
                args = infer_arguments(calls, inputs, self._constants(inputs), dynamic_batch=dynamic_batch)
            except CaptureError:
                # no call has every input (a state model: the mask at prefill, the state after): the inputs of
                # the richest call, inferred from the calls that have them all
                richest = max(calls, key=lambda c: len(flat_inputs(c.kwargs, inputs)))
                kept = [n for n in inputs if flat_inputs(richest.kwargs, [n])]
                calls = [c for c in calls if all(flat_inputs(c.kwargs, [n]) for n in kept)]
                logger.warning("no observed call has all of %s: the graph takes %s, as %d of %d calls had them",
                               inputs, kept, len(calls), self.num_obs())
                args = infer_arguments(calls, kept, self._constants(kept), dynamic_batch=dynamic_batch)
            self._inferred[key] = args
        return self._inferred[key]

    def _call(self, given: tuple | dict | int) -> Call:
        if isinstance(given, int):
            if not 0 <= given < self.num_obs():
                raise RuntimeError(f"No stored input set for index={given}<{self.num_obs()}.")
            return self._calls()[given]
        if isinstance(given, tuple):
            return Call(dict(zip(self._parameters(), given)), positional=len(given))
        if isinstance(given, dict):
            return Call(dict(given))
        raise ValueError(f"Unexpected type {type(given)} for index_or_args_or_kwargs.")

    @staticmethod
    def _filled(call: Call, args: ExportArguments) -> dict[str, torch.Tensor]:
        """The call's flat inputs, those it lacks (the empty cache at prefill) filled with empty or zero tensors."""
        names = [n for n in args.kwargs if n in call.kwargs]
        return substitute_missing(flat_inputs(call.kwargs, names), args)

    def _positional(self) -> bool:
        """Whether every call passed its arguments by position only (torch's then takes tuples)."""
        params = list(self._parameters())
        if any(self._parameters()[p].kind is inspect.Parameter.VAR_POSITIONAL for p in params):
            return False
        if any(isinstance(k, str) for k in self.value_if_missing):
            return False
        used = set(self._arguments().kwargs)
        return all(
            {k for k in c.kwargs if k in used} <= set(params[:c.positional])
            for c in self._recorder.calls
        )

    def _structured(self, values: dict[str, Any]) -> tuple | dict:
        """Per-argument `values` as torch's observer returns them: a tuple for positional calls, a dict
        otherwise, arguments the method takes through `**kwargs` under that name."""
        inputs = self._arguments().kwargs
        values = {k: ({} if v is None and not _plain(inputs[k]) else v) for k, v in values.items()}  # torch's: {} if static
        if self._positional():
            return tuple(values.values())
        params, keywords = self._parameters(), self._keywords()
        extra = {k: v for k, v in values.items() if k not in params}
        if not extra or not keywords:
            return values
        return {**{k: v for k, v in values.items() if k in params}, keywords: extra}

    def _register(self) -> None:
        """Cache classes are pytree nodes from the first inference until this observer is collected."""
        if not self._registered:
            flatten.register()
            weakref.finalize(self, flatten.unregister)
            self._registered = True


def _structured_empty_caches(calls: list[Call]) -> list[Call]:
    """An empty key/value cache (prefill) given the layers of the first filled one of its class, with no past,
    so the prefill has every input. State caches stay empty: their prefill is no step of the decode graph."""
    for call in calls:
        for name, value in call.kwargs.items():
            if not is_cache(value) or flatten_cache(value)[1]:
                continue
            filled = next((c.kwargs[name] for c in calls if type(c.kwargs.get(name)) is type(value)
                           and flatten_cache(c.kwargs[name])[1]), None)
            if filled is None:
                continue
            leaves, tensors, context = flatten_cache(filled)
            if all(leaf.rpartition(".")[2] in ("key", "value") for leaf in leaves):
                empty = [t.new_zeros(t.shape[:-2] + (0,) + t.shape[-1:]) for t in tensors]
                call.kwargs[name] = unflatten_cache(type(filled), context, empty)
    return calls


def _plain(value: Any) -> bool:
    return isinstance(value, (bool, int, float, str))


def _compare(expected: list, got: list | None, atol: float, rtol: float, skip_none: bool) -> dict[str, Any]:
    if got is None or len(expected) != len(got):
        return dict(SUCCESS=False, error="not the same number of outputs")
    err_abs = err_rel = 0.0
    for want, have in zip(expected, got):
        if want is None or have is None:
            if type(want) is not type(have) and not skip_none:
                return dict(SUCCESS=False, error="missing output")
            continue
        if want.shape != have.shape or want.dtype != have.dtype:
            return dict(SUCCESS=False, error="not the same shape" if want.shape != have.shape else "not the same type")
        if want.numel():
            diff = (want - have).abs()
            err_abs = max(err_abs, diff.max().item())
            err_rel = max(err_rel, (diff / (want.abs() + rtol)).max().item())
    return dict(SUCCESS=err_abs <= atol and err_rel <= rtol, abs=err_abs, rel=err_rel)
