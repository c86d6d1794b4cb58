"""Discrepancy report: onnxruntime vs PyTorch on every captured call."""

from .gate import GROSS_ABOVE, WARN_ABOVE, GrossMismatch, gate, random_draws
from .report import Discrepancy, as_dicts, compare, references, substitute_missing, table

__all__ = ["GROSS_ABOVE", "WARN_ABOVE", "Discrepancy", "GrossMismatch", "as_dicts", "compare", "gate", "random_draws", "references", "substitute_missing", "table"]
