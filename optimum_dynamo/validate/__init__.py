"""Discrepancy report: onnxruntime vs PyTorch on every captured call."""

from .gate import gate
from .report import Discrepancy, as_dicts, compare, substitute_missing, table

__all__ = ["Discrepancy", "as_dicts", "compare", "gate", "substitute_missing", "table"]
