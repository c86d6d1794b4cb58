"""onnxscript's fusions into onnxruntime's CPU contrib ops (com.microsoft), one pass per fusion.

RMSNorm -> SimplifiedLayerNormalization, residual + norm -> Skip(Simplified)LayerNormalization, rotary
embedding, its cos/sin cache, GELU, bias-GELU. onnxscript's attention fusions are not used (see
`cache_attention`).
"""

from __future__ import annotations

import importlib

import onnx_ir as ir

from . import note_fused, note_unfused


FUSIONS = {  # name -> (module of onnxscript.rewriter.ort_fusions, its fusion function)
    "erf_gelu": ("erfgelu", "fuse_erfgelu"),
    "rms_normalization": ("rms_normalization", "fuse_rms_normalization"),
    "skip_layer_normalization": ("skip_normalization", "fuse_skip_layer_normalization"),
    "skip_rms_normalization": ("skip_normalization", "fuse_skip_rms_normalization"),
    "rotary_embedding": ("rotary_embedding", "fuse_rotary_embedding"),
    "cos_sin_cache": ("cos_sin_cache", "fuse_cos_sin_cache"),
    "partial_rotary_embedding": ("rotary_embedding", "fuse_partial_rotary_embedding"),
    "gelu": ("gelu", "fuse_gelu"),
    "bias_gelu": ("bias_gelu", "fuse_bias_gelu"),
}


class OrtFusion(ir.passes.InPlacePass):
    """The onnxscript fusion `name` (a key of FUSIONS); records why it matched nothing."""

    def __init__(self, name: str):
        super().__init__()
        self.name = name

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        module, function = FUSIONS[self.name]
        fuse = getattr(importlib.import_module(f"onnxscript.rewriter.ort_fusions.{module}"), function)
        count = fuse(model)
        if count:
            note_fused(model, self.name, count)
        else:
            note_unfused(model, self.name, why_not(fuse, model))
        return ir.passes.PassResult(model, count > 0)


def why_not(fuse, model: ir.Model) -> str:
    """The failure of the closest match onnxscript's tracer found (tracing changes nothing)."""
    from onnxscript.rewriter import MatchingTracer

    tracer = MatchingTracer()
    fuse(model, tracer=tracer)
    best = max((m for matches in tracer.best_matches_map.values() for m in matches), key=lambda m: m.score(),
               default=None)
    if best is None:
        return "no part of the pattern matched"
    reason = best.match_result.reason or "pattern did not match"
    return f"{best.status.name.lower()} at {best.root_node.op_type} node {best.root_node.name!r}: {reason}"
