"""`ORTOptimizer.optimize` (optimum-onnx 0.1.0 and its main branch at 1939f27) deletes the source model's
`<file>.onnx_data` whenever the model keeps its weights outside the graph file, also when it saves to another
directory (`optimization.py`: "if loading from disk and saving in the same repository" — the check of the
directory is missing). So `optimum-cli onnxruntime optimize --onnx_model DIR -o OUT` leaves DIR's graph without
its weights. The wrapper keeps the source's weights file when the result goes elsewhere.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from .hooks import MethodPatch


def _patch(cls, original: dict) -> None:
    optimize = original["optimize"] = cls.optimize

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


PATCH = MethodPatch("optimum.onnxruntime.optimization", "ORTOptimizer", _patch)
install, uninstall = PATCH.install, PATCH.uninstall
