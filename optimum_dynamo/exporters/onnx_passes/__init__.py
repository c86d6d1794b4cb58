"""The graph optimizer's jobs, one onnx_ir pass each (`onnx_optimize` lists them by `--optimize` level).

A fusion that matched nothing says why in `model.meta` (`note_unfused`); the manifest records it (`unfused`).
"""

from __future__ import annotations

import logging

import onnx_ir as ir

logger = logging.getLogger(__name__)

CONTRIB_DOMAIN = "com.microsoft"  # onnxruntime's contrib operators
UNFUSED_KEY = "optimum_dynamo.unfused"  # model.meta: fusion name -> why it matched nothing
FUSED_KEY = "optimum_dynamo.fused"  # model.meta: fusion name -> how many times it applied


def note_fused(model: ir.Model, name: str, count: int) -> None:
    """Record how many times the fusion `name` applied (the stage logs one summary line; -v: each)."""
    model.meta.setdefault(FUSED_KEY, {})[name] = count
    logger.debug("    fused %s: %d", name, count)


def note_unfused(model: ir.Model, name: str, reason: str) -> None:
    """Record why the fusion `name` matched nothing in `model` (most fusions do not apply to a given model)."""
    model.meta.setdefault(UNFUSED_KEY, {})[name] = reason
    logger.debug("    not fused: %s (%s)", name, reason)


def fused(model: ir.Model) -> dict[str, int]:
    """The fusions that applied in `model`: name -> count."""
    return dict(model.meta.get(FUSED_KEY, {}))


def unfused(model: ir.Model) -> dict[str, str]:
    """The fusions that matched nothing in `model`: name -> reason."""
    return dict(model.meta.get(UNFUSED_KEY, {}))


class NodeRewrite(ir.passes.InPlacePass):
    """A pass rewriting each standard-domain node of `op_type` that `match` accepts (`match(node)` -> the arguments
    of `rewrite(graph, node, *arguments)`, or why not); records how many it rewrote, or why none."""

    name = op_type = ""
    none_found = ""  # why nothing was rewritten when no node of `op_type` was there to try

    def match(self, node: ir.Node):
        raise NotImplementedError

    def rewrite(self, graph: ir.Graph, node: ir.Node, *found) -> None:
        raise NotImplementedError

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        count, reasons = 0, []
        for node in list(model.graph):
            if node.op_type != self.op_type or node.domain != "":
                continue
            found = self.match(node)
            if isinstance(found, str):
                reasons.append(found)
                continue
            self.rewrite(model.graph, node, *found)
            count += 1
        if count:
            note_fused(model, self.name, count)
        else:
            note_unfused(model, self.name, reasons[0] if reasons else self.none_found)
        return ir.passes.PassResult(model, count > 0)
