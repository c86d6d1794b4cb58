"""What a discrepancy table means for the export.

Without --atol: a difference above the warning threshold is a warning line; above the gross threshold the
graph is wrong and the export fails (`GrossMismatch`, a PipelineError: the CLI falls back to the torchscript
exporter where optimum has an OnnxConfig, else exits non-zero; nothing is written). With --atol, the user's
bound decides alone (a looser one writes a graph the gross rule would refuse).

The thresholds, per dtype: fp32 graphs match PyTorch to ~1e-6 (kernel order and fusions), so 1e-3 is worth a
warning and 1e-2 on logits is an error in the graph, not rounding: at that size greedy tokens already flip
(afmoe's 0.11 did). fp16 rounds every op's result to 11 bits: both thresholds 20x. Rounding is relative: an
output whose values exceed SCALE_ABOVE (a random head's logits in the hundreds, a decoder's outlier features)
has thresholds in proportion (SwiftFormer's logits of 950: 7e-2 apart, 7e-5 of each value).
"""

from __future__ import annotations

import logging
from typing import Sequence

from ..errors import ExportError, PipelineError
from .report import Discrepancy

logger = logging.getLogger(__name__)
WARN_ABOVE = {"fp32": 1e-3, "fp16": 2e-2}
GROSS_ABOVE = {"fp32": 1e-2, "fp16": 2e-1}
SCALE_ABOVE = 10.0


def factor(magnitude: float) -> float:
    """The thresholds' factor for an output whose largest |value| is `magnitude`: its size beyond SCALE_ABOVE."""
    return max(1.0, magnitude / SCALE_ABOVE)


class GrossMismatch(PipelineError):
    """Validation showed the graph to be grossly wrong (the message is the one line shown)."""


_DRAWS = {"rand", "rand_like", "randn", "randn_like", "randint", "randint_like", "randperm", "bernoulli", "normal",
          "uniform", "multinomial", "exponential", "poisson"}


def random_draws(program) -> tuple[str, ...]:
    """The random-number ops an exported program runs (ViT-MAE's masking noise: `aten.rand`), sorted."""
    names = {str(node.target).split(".")[1] for node in program.graph.nodes
             if node.op == "call_function" and str(node.target).startswith("aten.")}
    return tuple(sorted(n for n in names if n.rstrip("_") in _DRAWS))


def gate(rows: Sequence[Discrepancy], atol: float | None, dtype: str = "fp32", graph: str = "",
         draws: tuple[str, ...] = ()) -> None:
    """Raise ExportError when the worst output differs from PyTorch by more than `atol`; without `atol`,
    GrossMismatch above the dtype's gross threshold, a warning above its warning threshold. `graph`: the
    component's name, if several; `draws`: the random-number ops of its forward (`random_draws`), named as the
    reason of a gross difference."""
    worst = max(rows, key=lambda r: r.max_abs / factor(r.magnitude), default=None)
    if worst is None:
        return
    which = f"{graph}: output" if graph else "output"
    differs = f"{which} {worst.output!r} differs from PyTorch by {worst.max_abs:.3e}"
    if atol is not None:
        if worst.max_abs > atol:
            raise ExportError(f"{differs} > atol {atol:g} (call {worst.worst_call})")
        return
    gross, warn = (limit[dtype] * factor(worst.magnitude) for limit in (GROSS_ABOVE, WARN_ABOVE))
    if worst.max_abs > gross:  # NaN counts as infinite (see report)
        why = (f"the forward draws random numbers ({', '.join(draws)}): no two runs agree, PyTorch's own included"
               if draws else "the graph is wrong")
        raise GrossMismatch(f"{differs} > {gross:g} (call {worst.worst_call}): {why}; "
                            "an explicit --atol above the difference writes it anyway")
    if worst.max_abs > warn:
        logger.warning("    warning: %s (> %g); pass --atol to make this an error", differs, warn)
