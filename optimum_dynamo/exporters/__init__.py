"""Staged exporters: shared stages in `base`, one module per backend."""

from .base import ExportContext, Exporter, stage
from .observed import ObservedOnnxExporter, export_observed
from .entry import export_onnx
from .onnx import OnnxExporter

__all__ = ["ExportContext", "Exporter", "ObservedOnnxExporter", "OnnxExporter", "export_observed", "export_onnx", "stage"]
