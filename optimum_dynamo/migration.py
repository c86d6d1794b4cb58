"""The migration switch: `OPTIMUM_DYNAMO_DEFAULT=1` makes the dynamo path the default of an environment.

With it set, `optimum-cli export onnx` exports as if `--dynamo` were given and
`ORTModel*.from_pretrained(export=True)` as if `dynamo=True` were; `--no-dynamo` / `dynamo=False` go back
to the torchscript exporter for one call. Every entry point decides through `use_dynamo`.
"""

from __future__ import annotations

import contextvars
import os
from contextlib import contextmanager

from .errors import ExportError

ENV = "OPTIMUM_DYNAMO_DEFAULT"
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


def dynamo_by_default() -> bool:
    """Whether the environment asks for the dynamo path when a call does not say."""
    value = os.environ.get(ENV, "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ExportError(f"invalid {ENV}={os.environ[ENV]!r}: expected 1 or 0")


_torchscript_chosen = contextvars.ContextVar("optimum_dynamo_torchscript_chosen", default=False)


@contextmanager
def torchscript_chosen():
    """Inside: calls that do not say (optimum's own `main_export` under `--no-dynamo`, `dynamo=False` or the
    fallback) use the torchscript exporter whatever the environment's default."""
    token = _torchscript_chosen.set(True)
    try:
        yield
    finally:
        _torchscript_chosen.reset(token)


def use_dynamo(requested: bool | None) -> bool:
    """The call's explicit choice (True/False), else the torchscript choice of an enclosing call, else the
    environment's default."""
    if requested is None:
        return False if _torchscript_chosen.get() else dynamo_by_default()
    return bool(requested)
