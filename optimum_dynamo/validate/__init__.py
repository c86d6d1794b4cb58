"""Discrepancy report: onnxruntime vs PyTorch on every captured call."""

from .report import Discrepancy, as_dicts, compare, substitute_missing, table

__all__ = ["Discrepancy", "as_dicts", "compare", "substitute_missing", "table"]
