"""onnxscript's optimizer (constant folding, its default rewrite rules, dead code) minus two no-op rules.

onnxscript 0.7.2's no-op rules match their constant with an absolute tolerance of 1e-8, so `x + 0` / `x - 0`
remove an RMSNorm's `+ eps` with eps = 1e-8 (helium) and a zero hidden row (a padding token) becomes
0 / 0 = NaN: those two are left out. `x * 1` and `x / 1` also match within a relative 1e-5, so they removed
transformers 4.57 Idefics3's `* (1 - 1e-6)` (patch positions then fell into the next bucket): they are kept
with an exact 1 (the rotary fusions need llama's `cos * attention_scaling` gone, where it is 1.0).

`optimizer.optimize_ir` takes no rule list, so its steps are composed here from public passes, in its order.
"""

from __future__ import annotations

import onnx_ir as ir
import onnx_ir.passes.common as common_passes

from .lazy_weights import InitializersInUseOrder, LazyTransposes, reads_lazy
from .slices_split import SlicesSplit


# onnxscript 0.7.2's default rules (`rewriter.rewrite`'s), in its order, without `x + 0` / `x - 0` and with
# `slice_split_rule` run as a linear pass (`slices_split.py`); a name another onnxscript version lacks is skipped
DEFAULT_RULES = (
    "dropout_zero_rule", "dropout_inference_rule", "two_reshapes_matmul_reshape_rule",
    "one_reshape_matmul_reshape_rule", "cast_constant_of_shape_rule", "cast_constant_of_shape_without_value_rule",
    "collapse_slice_rule", "collapse_slice2_rule", "materialize_reshape_shape_rule", "min_min_rule", "max_max_rule",
    "min_max_rule", "max_min_rule", "successive_clip_relu_rule", "successive_relu_clip_rule", "successive_relu_rule",
    "successive_clip_rule", "cast_cast_rule", "no_op_cast_rule", "no_op_expand_rule", "flatten_to_reshape_rule",
    "reshape_reshape_rule", "no_op_transpose_rule", "transpose_transpose_rule",
    "unsqueeze_unsqueeze_rule", "squeeze_reshape_1d_rule", "no_op_dynamic_scatter_nd_rule",
    "no_op_static_scatter_nd_rule", "normalize_pad_format_conv_rule", "normalize_pad_format_conv_integer_rule",
    "fuse_pad_into_conv_rule", "fuse_pad_into_conv_integer_rule", "fuse_batchnorm_into_conv_rule",
    "fuse_batchnorm_into_conv_transpose_rule", "fuse_batchnorm_into_gemm_rule",
    "remove_optional_bias_from_conv_rule", "remove_optional_bias_from_conv_transpose_rule",
    "remove_optional_bias_from_qlinear_conv_rule", "remove_optional_bias_from_gemm_rule",
)


def rewrite_rules() -> list:
    """onnxscript's default rewrite rules without `x + 0` / `x - 0`, `x * 1` (both ways) and `x / 1` with an
    exact 1 first, as its list."""
    from onnxscript.rewriter import pattern
    from onnxscript.rewriter.rules import common as r

    def one():
        return pattern.Constant(1, rel_tol=0.0, abs_tol=0.0)

    mul_by_1 = pattern.RewriteRule(lambda op, x: op.Mul(x, one()), lambda op, x: op.Identity(x))
    div_by_1 = pattern.RewriteRule(lambda op, x: op.Div(x, one()), lambda op, x: op.Identity(x))
    return [*mul_by_1.commute(), div_by_1, *(getattr(r, name) for name in DEFAULT_RULES if hasattr(r, name))]


class FoldConstants(ir.passes.InPlacePass):
    """onnxscript's constant folding, with ONNX shape inference (as its optimizer runs it)."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        from onnxscript import optimizer

        folded = optimizer.fold_constants_ir(model, onnx_shape_inference=True,
                                             should_fold=lambda node: False if reads_lazy(node) else None)
        return ir.passes.PassResult(model, folded.modified)


class OnnxscriptOptimize(ir.passes.InPlacePass):
    def call(self, model: ir.Model) -> ir.passes.PassResult:
        from onnxscript import rewriter

        cleanup = [common_passes.RemoveUnusedNodesPass(), common_passes.RemoveUnusedFunctionsPass(),
                   common_passes.RemoveUnusedOpsetsPass()]
        return ir.passes.Sequential(
            common_passes.InlinePass(),
            LazyTransposes(),  # weights streamed from the checkpoint stay unread (`lazy_weights`)
            ir.passes.PassManager([FoldConstants(), rewriter.RewritePass(rewrite_rules()), SlicesSplit(), *cleanup],
                                  steps=2, early_stop=True),
            common_passes.RemoveUnusedNodesPass(),
            common_passes.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0),
            common_passes.LiftSubgraphInitializersToMainGraphPass(),
            common_passes.DeduplicateInitializersPass(),
            common_passes.CommonSubexpressionEliminationPass(),
            common_passes.OutputFixPass(),
            common_passes.NameFixPass(),
            InitializersInUseOrder(),
        )(model)
