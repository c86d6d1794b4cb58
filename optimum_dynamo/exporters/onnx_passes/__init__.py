"""The graph optimizer's jobs, one onnx_ir pass each (`onnx_optimize` lists them by `--optimize` level).

A fusion that matched nothing says why in `model.meta` (`note_unfused`); the manifest records it (`unfused`).
"""

from __future__ import annotations

import logging

import onnx_ir as ir

logger = logging.getLogger(__name__)

UNFUSED_KEY = "optimum_dynamo.unfused"  # model.meta: fusion name -> why it matched nothing


def note_unfused(model: ir.Model, name: str, reason: str) -> None:
    """Record (and log) why the fusion `name` matched nothing in `model`."""
    model.meta.setdefault(UNFUSED_KEY, {})[name] = reason
    logger.info("    not fused: %s (%s)", name, reason)


def unfused(model: ir.Model) -> dict[str, str]:
    """The fusions that matched nothing in `model`: name -> reason."""
    return dict(model.meta.get(UNFUSED_KEY, {}))
