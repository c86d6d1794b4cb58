"""What a discrepancy table means for the export: a warning above a threshold, an error above --atol."""

from __future__ import annotations

import logging
from typing import Sequence

from ..errors import ExportError
from .report import Discrepancy

logger = logging.getLogger(__name__)
WARN_ABOVE = 1e-3  # fp32, without --atol: a larger difference is reported as a warning


def gate(rows: Sequence[Discrepancy], atol: float | None, warn_above: float, graph: str = "") -> None:
    """Warn when the worst output differs from PyTorch by more than `warn_above` (no --atol given); raise
    ExportError (one line) when it differs by more than `atol`. `graph`: the component's name, if several."""
    worst = max(rows, key=lambda r: r.max_abs, default=None)
    if worst is None:
        return
    which = f"{graph}: output" if graph else "output"
    if atol is None and worst.max_abs > warn_above:
        logger.warning("    warning: %s %r differs from PyTorch by %.3e (> %g); pass --atol to make this an error",
                       which, worst.output, worst.max_abs, warn_above)
    if atol is not None and worst.max_abs > atol:
        raise ExportError(f"{which} {worst.output!r} differs from PyTorch by {worst.max_abs:.3e} > atol {atol:g} "
                          f"(call {worst.worst_call})")
