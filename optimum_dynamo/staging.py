"""Atomic output: files are written to a staging directory beside the output and moved in place only
when everything succeeded; on failure nothing is left (nor the parent directories made for it)."""

from __future__ import annotations

import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def staged(output: Path) -> Iterator[Path]:
    output = Path(output)
    created = [p for p in [output, *output.parents] if not p.exists()]
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".optimum-dynamo-", dir=output.parent))
    try:
        yield staging
        output.mkdir(exist_ok=True)
        for item in staging.iterdir():
            target = output / item.name
            if target.is_dir():
                shutil.rmtree(target)
            item.replace(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if output in created and output.exists():
            shutil.rmtree(output)
        for parent in created[1:]:  # directories made for the output, deepest first
            parent.rmdir()
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
