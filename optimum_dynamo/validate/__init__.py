"""Discrepancy report: onnxruntime vs PyTorch on every captured call."""

from .gate import WARN_ABOVE, gate
from .report import Discrepancy, as_dicts, compare, references, substitute_missing, table

__all__ = ["WARN_ABOVE", "Discrepancy", "as_dicts", "compare", "gate", "references", "substitute_missing", "table"]
