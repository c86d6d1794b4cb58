"""The torchscript exporter of optimum-onnx as the fallback of `--dynamo`, until its deprecation.

`has_onnx_config` asks optimum's task registry whether a legacy OnnxConfig covers (model type, task);
`export_torchscript` runs optimum's `main_export` into a staging directory and moves the files in place
only when it succeeded, so a failed fallback leaves nothing behind either.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

DEPRECATION = (
    "optimum-cli export onnx: the torchscript exporter is deprecated; add --dynamo to export with torch.export "
    "(set OPTIMUM_DYNAMO_NO_DEPRECATION=1 to silence this notice)"
)


def deprecation_notice() -> None:
    """One line on stderr, unless OPTIMUM_DYNAMO_NO_DEPRECATION=1."""
    if os.environ.get("OPTIMUM_DYNAMO_NO_DEPRECATION") != "1":
        print(DEPRECATION, file=sys.stderr)


def has_onnx_config(model_type: str, task: str) -> bool:
    from optimum.exporters.tasks import TasksManager

    try:
        tasks = TasksManager.get_supported_tasks_for_model_type(
            model_type.replace("_", "-"), "onnx", library_name="transformers"
        )
    except KeyError:
        return False
    return task in tasks


def export_torchscript(model_id: str, output: Path, task: str, **kwargs) -> None:
    from optimum.exporters.onnx import main_export

    output = Path(output)
    created = [p for p in [output, *output.parents] if not p.exists()]
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".optimum-torchscript-", dir=output.parent))
    try:
        main_export(model_name_or_path=model_id, output=staging, task=task, **kwargs)
        output.mkdir(exist_ok=True)
        for item in staging.iterdir():
            item.replace(output / item.name)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        for path in created[1:]:
            path.rmdir()
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
