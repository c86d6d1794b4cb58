"""Graph optimization of an exported ONNX model, by `--optimize` level (optimum's levels and meaning).

A level is a list of onnx_ir passes (`onnx_passes`, one job each; `passes(level)`):
- default (no level) and O1: onnxscript's optimizer (constant folding, rewrites, dead code);
- O2: + shape-computation simplification, MatMuls sharing an input packed into one, and the vocabulary
  projection's weight left unpacked for onnxruntime; still standard ONNX;
- O3: + fusions into onnxruntime's CPU contrib ops (onnxscript's: RMSNorm, skip norms, rotary, GELU...),
  plus — decided before translation — SDPA as ONNX `Attention` (opset 23) on unrepeated grouped key/value
  heads, then given the cache and token-major inputs (`cache_attention`); a fusion that matched nothing says
  why (`unfused`);
- O4: O3 + fp16 for a GPU: refused (no fp16 path yet, and it needs a CUDA device).
"""

from __future__ import annotations

import collections
from typing import Sequence

import onnx_ir as ir
import onnx_ir.passes.common as common_passes

from ..options import FUSED_LEVELS
from .onnx_passes import CONTRIB_DOMAIN, fused, unfused
from .onnx_passes.cache_attention import CacheAttention
from .onnx_passes.onnxscript_optimize import OnnxscriptOptimize
from .onnx_passes.ort_fusions import OrtFusion
from .onnx_passes.pack_matmuls import PackMatmuls
from .onnx_passes.rotary_positions import RotaryAtPositions
from .onnx_passes.shapes import SimplifyShapes
from .onnx_passes.share_input_dims import ShareInputDims, share_input_dims
from .onnx_passes.unpack_vocab import UnpackVocab

ATTENTION_OPSET = 23  # first opset with ONNX Attention


def default_opset(level: str | None) -> int | None:
    """The opset to translate to when the user did not choose one."""
    return ATTENTION_OPSET if level in FUSED_LEVELS else None


def passes(level: str | None) -> list[ir.passes.PassBase]:
    """The passes `level` runs, in order."""
    if level not in ("O2", *FUSED_LEVELS):
        return [OnnxscriptOptimize()]
    fusions = []
    if level in FUSED_LEVELS:
        fusions = [
            *map(OrtFusion, ("erf_gelu", "rms_normalization", "skip_layer_normalization", "skip_rms_normalization",
                             "rotary_embedding", "cos_sin_cache")),
            common_passes.CommonSubexpressionEliminationPass(),
            OrtFusion("partial_rotary_embedding"),
            CacheAttention(),  # after the rotary fusions: it reads them
            RotaryAtPositions(),  # after the attention's: its token-major rotations read the table too
            OrtFusion("gelu"), OrtFusion("bias_gelu"),
            ShareInputDims(),  # the attention fusion reads input dims again
            OnnxscriptOptimize(),
        ]
    return [OnnxscriptOptimize(), SimplifyShapes(), OnnxscriptOptimize(), *fusions, PackMatmuls(), UnpackVocab()]


def optimize(model: ir.Model, level: str | None = None, extra: Sequence[ir.passes.PassBase] = ()) -> ir.Model:
    """Run `level`'s passes, then `extra`, on `model`; return the result (`model` itself for in-place passes)."""
    return ir.passes.Sequential(*passes(level), *extra)(model).model


def contrib_ops(model: ir.Model) -> dict[str, int]:
    """onnxruntime contrib ops (com.microsoft) and ONNX Attention, subgraphs included: name -> count."""
    found = collections.Counter(
        n.op_type for n in ir.traversal.RecursiveGraphIterator(model.graph)
        if n.domain == CONTRIB_DOMAIN or (n.domain == "" and n.op_type == "Attention")
    )
    return dict(sorted(found.items()))


__all__ = ["ATTENTION_OPSET", "contrib_ops", "default_opset", "optimize",
           "fused", "passes", "share_input_dims", "unfused"]
