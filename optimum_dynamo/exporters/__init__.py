"""Staged exporters: shared stages in `base`, one module per backend."""

from .base import ExportContext, Exporter, stage
from .onnx import OnnxExporter, export_onnx

__all__ = ["ExportContext", "Exporter", "OnnxExporter", "export_onnx", "stage"]
