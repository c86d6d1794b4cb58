"""onnxscript's graph optimizer without its no-op rules.

onnxscript 0.7.2's no-op rules (`x + 0`, `x - 0`, `x * 1`, `x / 1`, dropout) match their constant with
an absolute tolerance of 1e-8, so an RMSNorm's `+ eps` with eps = 1e-8 (helium) is removed and a zero
hidden row (a padding token) becomes 0 / 0 = NaN. Constant folding and every other default rule still run.
"""

from __future__ import annotations

import contextlib
import logging

import onnx_ir as ir

logger = logging.getLogger("optimum_dynamo")


@contextlib.contextmanager
def _without_no_op_rules():
    """Swap onnxscript's default rewrite rules for the same list minus the no-op rules, then restore."""
    try:
        from onnxscript import rewriter
        from onnxscript.rewriter.rules.common import _no_op

        defaults, no_op = rewriter._DEFAULT_REWRITE_RULES, set(_no_op.rules.rules)
    except (ImportError, AttributeError):  # another onnxscript layout: keep its defaults
        logger.warning("    onnxscript's no-op rules not found; optimizing with all default rules")
        yield
        return
    rewriter._DEFAULT_REWRITE_RULES = tuple(r for r in defaults if r not in no_op)
    try:
        yield
    finally:
        rewriter._DEFAULT_REWRITE_RULES = defaults


def optimize(model: ir.Model) -> ir.Model:
    """Optimize `model` in place (constant folding, rewrites, dead code) and return it."""
    from onnxscript import optimizer

    with _without_no_op_rules():
        optimizer.optimize_ir(model)
    return model
