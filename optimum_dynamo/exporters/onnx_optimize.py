"""Graph optimization of an exported ONNX model, by `--optimize` level (optimum's levels and meaning).

- default (no level) and O1: onnxscript's optimizer (constant folding, rewrites, dead code);
- O2: + shape-computation simplification, MatMuls sharing an input packed into one, and the vocabulary
  projection's weight left unpacked for onnxruntime (`onnx_pack`); still standard ONNX;
- O3: + fusions into onnxruntime's CPU contrib ops (RMSNorm -> SimplifiedLayerNormalization, residual +
  norm -> SkipSimplifiedLayerNormalization, rotary embedding, GELU, bias-GELU), plus — decided before
  translation — SDPA as ONNX `Attention` (opset 23) on unrepeated grouped key/value heads, which becomes
  onnxruntime's `GroupQueryAttention` over the cache (`onnx_gqa`);
- O4: O3 + fp16 for a GPU: refused (no fp16 path yet, and it needs a CUDA device).

onnxscript's attention fusions (GroupQueryAttention, MultiHeadAttention) are not used: they drop the
attention mask (valid for right-padded or unpadded batches only), so a left-padded batch would be wrong.
`onnx_gqa` gives GroupQueryAttention the graph's own mask.

onnxscript 0.7.2's no-op rules match their constant with an absolute tolerance of 1e-8, so `x + 0` / `x - 0`
remove an RMSNorm's `+ eps` with eps = 1e-8 (helium) and a zero hidden row (a padding token) becomes
0 / 0 = NaN: those two are left out at every level. `x * 1` and `x / 1` stay (no float32 other than 1.0 is
within 1e-8 of it; the rotary fusions need llama's `cos * attention_scaling` gone).
"""

from __future__ import annotations

import collections
import contextlib
import logging

import onnx_ir as ir

from ..errors import ExportError
from .onnx_gqa import CONTRIB_DOMAIN, fuse_group_query_attention
from .onnx_pack import pack_matmuls, unpack_wide_weights

logger = logging.getLogger(__name__)

LEVELS = ("O1", "O2", "O3", "O4")
FUSED_LEVELS = ("O3", "O4")
ATTENTION_OPSET = 23  # first opset with ONNX Attention


def check_level(level: str | None) -> None:
    """Raise ExportError (one line) for a level this exporter cannot honour."""
    if level is None or level in ("O1", "O2", "O3"):
        return
    if level != "O4":
        raise ExportError(f"--optimize {level}: unknown level (choose from {', '.join(LEVELS)})")
    import onnxruntime

    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        raise ExportError("--optimize O4 (O3 + fp16) needs a CUDA GPU and onnxruntime-gpu; none is available: use O3")
    raise ExportError("--optimize O4 (O3 + fp16) is not supported with --dynamo yet: use O3")


def default_opset(level: str | None) -> int | None:
    """The opset to translate to when the user did not choose one."""
    return ATTENTION_OPSET if level in FUSED_LEVELS else None


def _adds_zero(rule) -> bool:
    """Whether a no-op rule is `x + 0` / `x - 0` (a rule whose pattern cannot be read counts as one)."""
    pattern = str(getattr(rule, "_target_pattern", " Add ("))
    return " Add (" in pattern or " Sub (" in pattern


@contextlib.contextmanager
def _without_no_op_rules():
    """Swap onnxscript's default rewrite rules for the same list minus the add/sub-zero rules, then restore."""
    try:
        from onnxscript import rewriter
        from onnxscript.rewriter.rules.common import _no_op

        defaults = rewriter._DEFAULT_REWRITE_RULES
        no_op = {r for r in _no_op.rules.rules if _adds_zero(r)}
    except (ImportError, AttributeError):  # another onnxscript layout: keep its defaults
        logger.warning("    onnxscript's no-op rules not found; optimizing with all default rules")
        yield
        return
    rewriter._DEFAULT_REWRITE_RULES = tuple(r for r in defaults if r not in no_op)
    try:
        yield
    finally:
        rewriter._DEFAULT_REWRITE_RULES = defaults


def share_input_dims(graph: ir.Graph) -> int:
    """One `Shape` read per set of named input axes. Axes that carry one name have one size: the names are
    the graph's contract with its runtime (every layer's `past_sequence_length`; a bounded sliding cache's
    axis has a name of its own). What is computed from them (masks, lengths) is then computed once, not
    once per layer. Returns the number of reads removed."""
    first: dict[tuple[str, ...], ir.Value] = {}
    removed = 0
    for node in list(graph):
        if node.op_type != "Shape" or node.domain != "" or node.inputs[0] is None or not node.inputs[0].is_graph_input():
            continue
        dims = list(node.inputs[0].shape or [])
        start, end = node.attributes.get_int("start", 0), node.attributes.get_int("end", len(dims))
        picked = dims[start:end]
        if not picked or not all(isinstance(d, ir.SymbolicDim) and d.value for d in picked):
            continue
        key = tuple(d.value for d in picked)
        if key not in first:
            first[key] = node.outputs[0]
            continue
        node.outputs[0].replace_all_uses_with(first[key])
        graph.remove(node, safe=True)
        removed += 1
    return removed


def _simplify_shapes(model: ir.Model) -> None:
    import onnx_ir.passes.common as common_passes
    from onnxscript import optimizer
    from onnxscript.rewriter.ort_fusions import shape_optimization

    common_passes.ShapeInferencePass()(model)
    shape_optimization.rules.apply_to_model(model)
    optimizer.optimize_ir(model)


def _fuse_for_onnxruntime(model: ir.Model) -> dict[str, int]:
    import onnx_ir.passes.common as common_passes
    from onnxscript import optimizer
    from onnxscript.rewriter.ort_fusions import (
        bias_gelu,
        cos_sin_cache,
        erfgelu,
        gelu,
        rms_normalization,
        rotary_embedding,
        skip_normalization,
    )

    fusions = [
        ("erf_gelu", erfgelu.fuse_erfgelu),
        ("rms_normalization", rms_normalization.fuse_rms_normalization),
        ("skip_layer_normalization", skip_normalization.fuse_skip_layer_normalization),
        ("skip_rms_normalization", skip_normalization.fuse_skip_rms_normalization),
        ("rotary_embedding", rotary_embedding.fuse_rotary_embedding),
        ("cos_sin_cache", cos_sin_cache.fuse_cos_sin_cache),
        ("partial_rotary_embedding", rotary_embedding.fuse_partial_rotary_embedding),
        ("group_query_attention", fuse_group_query_attention),  # after the rotary fusions: it reads them
        ("gelu", gelu.fuse_gelu),
        ("bias_gelu", bias_gelu.fuse_bias_gelu),
    ]
    counts = {}
    for name, fuse in fusions:
        counts[name] = fuse(model)
        if name == "cos_sin_cache":
            common_passes.CommonSubexpressionEliminationPass()(model)
    share_input_dims(model.graph)  # the attention fusion reads input dims again
    optimizer.optimize_ir(model)
    return {k: v for k, v in counts.items() if v}


def optimize(model: ir.Model, level: str | None = None) -> ir.Model:
    """Optimize `model` in place at `level` and return it."""
    from onnxscript import optimizer

    with _without_no_op_rules():
        optimizer.optimize_ir(model)
        if level in ("O2", *FUSED_LEVELS):
            _simplify_shapes(model)
        if level in FUSED_LEVELS:
            logger.info("    fusions: %s", _fuse_for_onnxruntime(model) or "none matched")
        if level in ("O2", *FUSED_LEVELS):
            logger.info("    packed MatMuls: %d fewer; wide weights left unpacked: %d", pack_matmuls(model),
                        unpack_wide_weights(model))
    return model


def contrib_ops(model: ir.Model) -> dict[str, int]:
    """onnxruntime contrib ops (com.microsoft) and ONNX Attention, subgraphs included: name -> count."""
    found = collections.Counter(
        n.op_type for n in ir.traversal.RecursiveGraphIterator(model.graph)
        if n.domain == CONTRIB_DOMAIN or (n.domain == "" and n.op_type == "Attention")
    )
    return dict(sorted(found.items()))
