"""What an export is of: the model (hub id, directory or in-memory object), its config and optimum's task name,
resolved once at the entry point. The exporter, its load stage and the torchscript fallback all read this one
resolution."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ExportError, first_line
from .options import ExportOptions
from .sentence_embeddings import is_sentence_transformers
from .tasks import Task, library_task, optimum_task, supported_task


@dataclass(frozen=True)
class Target:
    model_id: str  # hub id or directory; a name for an in-memory model
    config: Any
    task_name: str  # as optimum names it, e.g. "text-generation-with-past"
    model: Any = None  # an in-memory model, exported as it is
    library: str = "transformers"  # or "sentence_transformers"

    @property
    def task(self) -> Task:
        """The task's capture and runtime (PipelineError when --dynamo does not export it)."""
        return supported_task(self.task_name, self.config, self.library)


def load_config(model_id: str, options: ExportOptions):
    """The checkpoint's config; a missing directory, a directory without config.json or custom code not
    allowed is one error line."""
    from transformers import AutoConfig

    path = Path(model_id)
    if not path.is_dir() and (path.is_absolute() or model_id.startswith(".") or path.exists()):
        raise ExportError(f"model directory not found: {model_id}")
    if path.is_dir() and not (path / "config.json").is_file():
        raise ExportError(f"cannot load {model_id}: no config.json in it")
    try:
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
    config = load_config(str(model), options)
    library = options.library or ("sentence_transformers" if is_sentence_transformers(str(model)) else "transformers")
    if library == "sentence_transformers":
        task = library_task(task, library)
    return Target(str(model), config, optimum_task(task, str(model), config), library=library)


__all__ = ["Target", "load_config", "resolve"]
