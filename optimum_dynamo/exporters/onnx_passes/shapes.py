"""Shape computations simplified (onnxscript's onnxruntime shape rules, after shape inference)."""

from __future__ import annotations

import onnx_ir as ir
import onnx_ir.passes.common as common_passes


class SimplifyShapes(ir.passes.InPlacePass):
    def call(self, model: ir.Model) -> ir.passes.PassResult:
        from onnxscript.rewriter.ort_fusions import shape_optimization

        inferred = common_passes.ShapeInferencePass()(model).modified
        return ir.passes.PassResult(model, inferred or shape_optimization.rules.apply_to_model(model) > 0)
