"""optimum-dynamo: the torch.export-based ONNX exporter behind optimum's `--dynamo` flag.

Importing it is cheap: it installs the legacy bridge and the optimum hooks, which take effect
when optimum's modules are imported.
"""

__version__ = "0.1.0.dev0"

from .integration import install

install()

__all__ = ["__version__", "install"]
