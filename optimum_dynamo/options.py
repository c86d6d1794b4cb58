"""Option values checked before any work: a bad value is one error line, never a finished export
that fails at the end (or an option silently ignored)."""

from __future__ import annotations

import math

from .errors import ExportError

# torch 2.13: torch.onnx's dynamo exporter implements opset 18 (torchlib) and converts up to 23
# (`torch.onnx._constants.ONNX_MAX_OPSET`); lower opsets go through a lossy version converter.
MIN_OPSET = 18
MAX_OPSET = 23


def check_atol(atol) -> None:
    if atol is None:
        return
    if isinstance(atol, bool) or not isinstance(atol, (int, float)) or not math.isfinite(atol) or atol < 0:
        raise ExportError(f"invalid --atol {atol!r}: expected a finite number >= 0")


def check_opset(opset) -> None:
    if opset is None:
        return
    if isinstance(opset, bool) or not isinstance(opset, int) or not MIN_OPSET <= opset <= MAX_OPSET:
        raise ExportError(f"invalid --opset {opset!r}: the dynamo exporter supports opsets {MIN_OPSET} to {MAX_OPSET}")


def check_options(**options) -> None:
    """Check every known option value given (unknown names are left to their consumers)."""
    check_atol(options.get("atol"))
    check_opset(options.get("opset"))
