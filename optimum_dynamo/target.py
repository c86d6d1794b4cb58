"""What an export is of: the model (hub id, directory or in-memory object), its config and optimum's task name,
resolved once at the entry point. The exporter, its load stage and the torchscript fallback all read this one
resolution."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ExportError, first_line
from .options import ExportOptions
from .tasks import Task, library_task, optimum_task, supported_task


@dataclass(frozen=True)
class Target:
    model_id: str  # hub id or directory; a name for an in-memory model
    config: Any
    task_name: str  # as optimum names it, e.g. "text-generation-with-past"
    model: Any = None  # an in-memory model, exported as it is
    library: str = "transformers"  # or "sentence_transformers", "timm"

    @property
    def task(self) -> Task:
        """The task's capture and runtime (PipelineError when --dynamo does not export it)."""
        return supported_task(self.task_name, self.config, self.library)


def check_directory(model_id: str) -> None:
    """A path that is not a directory, or a directory without config.json: one error line (before any loading)."""
    path = Path(model_id)
    if not path.is_dir() and (path.is_absolute() or model_id.startswith(".") or path.exists()):
        raise ExportError(f"model directory not found: {model_id}")
    if path.is_dir() and not (path / "config.json").is_file():
        raise ExportError(f"cannot load {model_id}: no config.json in it")


def load_config(model_id: str, options: ExportOptions, library: str = "transformers"):
    """The checkpoint's config (a timm model's: its config.json as it is), of a path `check_directory` accepted;
    custom code not allowed is one error line."""
    from transformers import AutoConfig

    from . import timm_models

    try:
        if library == "timm":
            config = timm_models.load_config(model_id, **options.hub_options)
        else:
            config = AutoConfig.from_pretrained(model_id, **options.loading)
    except (OSError, ValueError) as e:
        if "trust_remote_code" in str(e):  # nothing of the checkpoint's code was imported
            raise ExportError(f"{model_id} contains custom code: read it, then pass --trust-remote-code "
                              "to run it") from e
        raise ExportError(f"cannot load {model_id}: {first_line(e, limit=400)}") from e
    if options.pad_token_id is not None:  # --pad_token_id: used by capture, saved in config.json
        config.pad_token_id = options.pad_token_id
    return config


def resolve(model, options: ExportOptions, default_task: str | None = None) -> Target:
    """`model` (hub id, directory or `PreTrainedModel`) and its task (`options.task`, else `default_task`,
    else inferred as optimum does)."""
    task = options.task if options.task not in (None, "auto") else default_task
    if not isinstance(model, (str, Path)):
        name = getattr(model, "name_or_path", "") or type(model).__name__
        return Target(name, model.config, optimum_task(task, model, model.config), model)
    check_directory(str(model))
    library = options.library or infer_library(str(model), options)
    if library == "timm" and importlib.util.find_spec("timm") is None:
        raise ExportError(f"{model} is a timm model: timm is not installed (pip install timm)")
    config = load_config(str(model), options, library)
    if library != "transformers":
        task = library_task(task, library)
    return Target(str(model), config, optimum_task(task, str(model), config), library=library)


# libraries --dynamo exports besides transformers (--library-name)
LIBRARIES = ("sentence_transformers", "timm")


def infer_library(model_id: str, options: ExportOptions) -> str:
    """The checkpoint's library as optimum infers it (sentence-transformers: its `modules.json`; timm: a config.json
    with timm's `pretrained_cfg`, unless transformers saved it); transformers for any other answer, or none (a hub id
    offline and not cached)."""
    from optimum.exporters.tasks import TasksManager

    hub = {k: v for k, v in options.hub_options.items() if k in ("revision", "cache_dir", "token", "subfolder")}
    try:
        library = TasksManager.infer_library_from_model(model_id, **hub)
        if library == "timm" and _saved_by_transformers(model_id, hub):
            return "transformers"
    except Exception:
        return "transformers"
    return library if library in LIBRARIES else "transformers"


def _saved_by_transformers(model_id: str, hub: dict) -> bool:
    """A config.json transformers wrote for its timm wrapper (TimmWrapperForImageClassification: it names the
    `architectures`, which timm's own never does), which optimum takes for timm's by its `pretrained_cfg`."""
    from transformers import PretrainedConfig

    config, _ = PretrainedConfig.get_config_dict(model_id, **hub)
    return "architectures" in config


__all__ = ["LIBRARIES", "Target", "check_directory", "infer_library", "load_config", "resolve"]
