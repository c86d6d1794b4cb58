"""`ORTOptimizer.optimize` (optimum-onnx 0.1.0 and its main branch at 1939f27) deletes the source model's
`<file>.onnx_data` whenever the model keeps its weights outside the graph file, also when it saves to another
directory (`optimization.py`: "if loading from disk and saving in the same repository" — the check of the
directory is missing). So `optimum-cli onnxruntime optimize --onnx_model DIR -o OUT` leaves DIR's graph without
its weights. The wrapper keeps the source's weights file when the result goes elsewhere.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

from .hooks import when_imported

_MODULE = "optimum.onnxruntime.optimization"
_original: dict[str, object] = {}
_enabled = False


def _kept(sources, save_dir) -> list[tuple[Path, Path]]:
    """(weights file, hard link beside it) for each source whose weights file lives outside `save_dir`."""
    kept = []
    for source in sources:
        data = Path(f"{Path(source).as_posix()}_data")
        if data.is_file() and data.parent.resolve() != Path(save_dir).resolve():
            link = data.with_name(f".{data.name}.kept")
            link.unlink(missing_ok=True)
            os.link(data, link)
            kept.append((data, link))
    return kept


def _patch(module) -> None:
    cls = module.ORTOptimizer
    if not _enabled or _original:
        return
    optimize = _original["optimize"] = cls.optimize

    @functools.wraps(optimize)
    def wrapped(self, optimization_config, save_dir, *args, **kwargs):
        kept = _kept(self.onnx_model_path, save_dir)
        try:
            return optimize(self, optimization_config, save_dir, *args, **kwargs)
        finally:
            for data, link in kept:
                if data.exists():
                    link.unlink()
                else:
                    link.rename(data)

    cls.optimize = wrapped


def install() -> None:
    global _enabled
    if not _enabled:
        _enabled = True
        when_imported(_MODULE, _patch)


def uninstall() -> None:
    global _enabled
    _enabled = False
    module = sys.modules.get(_MODULE)
    if module is not None and "optimize" in _original:
        module.ORTOptimizer.optimize = _original["optimize"]
    _original.clear()
