"""Validation of a weight-quantized graph: what quantization changed in the predictions.

A graph with 4-bit weights cannot match PyTorch to 1e-4, so it is judged on what a language model's user
sees, over every unpadded position of the captured calls' `logits`:

- top-1 agreement: the fraction of positions whose most likely next token is the same;
- relative RMS error: RMS(quantized - reference) / standard deviation of the reference's logits;
- max abs difference (reported, not gated).

Both are measured against the fp32 graph the quantized one came from (what quantization changed; that graph
passed the usual validation against PyTorch first) and against PyTorch (reported). The gate reads the former:
below `MIN_TOP1` or above `MAX_REL_RMS` the graph is wrong, not merely rounded. A wrong weight layout measured
top-1 0.0 and relative RMS 1.4 (chance, and uncorrelated logits). Random-weight models, whose nearly flat logits
are the hardest case, measured with 4 bits top-1 0.3-0.9 and relative RMS 0.10-0.34 (tiny models; a 56M llama,
short captured prompts to 256-token ones), with 8 bits top-1 0.89-1.0 and relative RMS <= 0.026. That noise grows
with depth and width on random weights: against PyTorch, a 1.2B llama (16 layers, hidden 2048) measured 4 bits top-1
0.27 and relative RMS 0.48 (8 bits: 0.92, 0.048), an 8B one (Llama-3.1-8B's shapes) 0.15 and 0.80. The bounds sit
between that noise and a wrong graph (relative RMS 1.4 uncorrelated, 1.0 for constant logits; top-1 near 1/vocab).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np

from .gate import GrossMismatch
from .piecewise import run_cases

LOGITS = "logits"
MIN_TOP1 = {4: 0.1, 8: 0.5}
MAX_REL_RMS = {4: 0.9, 8: 0.2}


@dataclass
class Agreement:
    against: str  # "fp32 graph" or "PyTorch"
    top1: float
    rel_rms: float
    max_abs: float
    positions: int


def logits_of(session, cases: Sequence[tuple[dict, dict]], input_names: list[str]) -> list[np.ndarray]:
    """The session's `logits` on every case's inputs (`validate.references`)."""
    index = [o.name for o in session.get_outputs()].index(LOGITS)
    return [out[index] for out in run_cases(session, [{n: feed[n].numpy() for n in input_names} for feed, _ in cases])]


def _positions(feed: dict, logits: np.ndarray) -> np.ndarray:
    """[batch, positions] of the logits that the attention mask keeps (right-aligned)."""
    mask = feed.get("attention_mask")
    rows = logits.reshape(logits.shape[0], -1, logits.shape[-1]).shape[1]
    if mask is None or mask.dim() != 2 or mask.shape[1] < rows or logits.ndim != 3:
        return np.ones(logits.shape[:-1], dtype=bool).reshape(logits.shape[0], -1)
    return mask[:, mask.shape[1] - rows:].bool().numpy()


def agreement(against: str, got: Sequence[np.ndarray], expected: Sequence[np.ndarray],
              cases: Sequence[tuple[dict, dict]]) -> Agreement:
    """`got` vs `expected` logits per case (the later positions when `expected` kept fewer)."""
    pairs = []
    for (feed, _), g, e in zip(cases, got, expected):
        g = g[..., -e.shape[-2]:, :] if g.ndim == 3 and e.ndim == 3 else g
        keep = _positions(feed, e)
        shape = (-1, e.shape[-1])
        pairs.append((g.reshape(shape)[keep.reshape(-1)], e.reshape(shape)[keep.reshape(-1)]))
    g = np.concatenate([p[0] for p in pairs]).astype(np.float64)
    e = np.concatenate([p[1] for p in pairs]).astype(np.float64)
    spread = float(e.std()) or 1.0
    return Agreement(against, top1=float((g.argmax(-1) == e.argmax(-1)).mean()),
                     rel_rms=float(np.sqrt(np.mean((g - e) ** 2)) / spread),
                     max_abs=float(np.abs(g - e).max(initial=0.0)), positions=len(g))


def gate(rows: Sequence[Agreement], bits: int, graph: str = "") -> None:
    """GrossMismatch when the quantized graph disagrees with its fp32 graph (else with PyTorch: weights streamed,
    no fp32 graph written) beyond what quantization does."""
    row = next((r for r in rows if r.against == "fp32 graph"), rows[-1])
    which = f"{graph}: " if graph else ""
    if not np.isfinite(row.rel_rms) or row.top1 < MIN_TOP1[bits] or row.rel_rms > MAX_REL_RMS[bits]:
        raise GrossMismatch(
            f"{which}the {bits}-bit graph disagrees with {'its fp32 graph' if row.against == 'fp32 graph' else row.against} "
            f"beyond quantization: top-1 agreement "
            f"{row.top1:.3f} (min {MIN_TOP1[bits]}), relative RMS error {row.rel_rms:.3f} (max {MAX_REL_RMS[bits]})")


def table(rows: Sequence[Agreement]) -> str:
    lines = [f"{'logits vs':<12} {'top-1':>7} {'rel RMS':>9} {'max abs':>10} {'positions':>10}"]
    lines += [f"{r.against:<12} {r.top1:>7.3f} {r.rel_rms:>9.4f} {r.max_abs:>10.3e} {r.positions:>10}" for r in rows]
    return "\n".join(lines)


def as_dicts(rows: Sequence[Agreement]) -> list[dict]:
    return [asdict(r) for r in rows]


__all__ = ["MAX_REL_RMS", "MIN_TOP1", "Agreement", "agreement", "as_dicts", "gate", "logits_of", "table"]
