"""The torchscript exporter of optimum-onnx as the fallback of `--dynamo`, until its deprecation.

`has_onnx_config` asks optimum's task registry whether a legacy OnnxConfig covers (model type, task);
`export_torchscript` runs optimum's `main_export`.
"""

from __future__ import annotations

import os
import sys
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
    """Asked of the complete registry: optimum-onnx fills TasksManager's ONNX table when its `model_configs`
    module is imported, which a fresh `optimum-cli export onnx --dynamo` process has not done yet."""
    import optimum.exporters.onnx.model_configs  # noqa: F401
    from optimum.exporters.tasks import TasksManager

    # optimum 2.x keys its registry by the config's model_type as it is (deepseek_v3, qwen3_moe, blenderbot-small);
    # older releases spelled some with "-" for "_".
    for name in dict.fromkeys((model_type, model_type.replace("_", "-"))):
        try:
            tasks = TasksManager.get_supported_tasks_for_model_type(name, "onnx", library_name="transformers")
        except KeyError:
            continue
        return task in tasks
    return False


def task_has_onnx_configs(task: str) -> bool:
    """Whether any model type has a torchscript OnnxConfig for `task` (optimum's name, synonyms mapped)."""
    import optimum.exporters.onnx.model_configs  # noqa: F401
    from optimum.exporters.tasks import TasksManager

    return bool(TasksManager.get_supported_model_type_for_task(TasksManager.map_from_synonym(task), exporter="onnx"))


def export_torchscript(model_id: str, output: Path, task: str, **kwargs) -> None:
    """optimum's torchscript `main_export` into `output` (the caller stages it)."""
    from optimum.exporters.onnx import main_export

    main_export(model_name_or_path=model_id, output=Path(output), task=task, **kwargs)
