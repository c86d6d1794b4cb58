"""onnxruntime runners for exports made of several graphs (one module per model family)."""
