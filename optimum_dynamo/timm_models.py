"""timm image classifiers (`--library-name timm`, or inferred as optimum infers it: a config.json with timm's
`pretrained_cfg`): the model timm builds from the checkpoint, pixel values in, `logits` out. The export keeps the
checkpoint's config.json, so optimum's `ORTModelForImageClassification` loads it as it loads a timm export of its own.

The capture feeds pixel values at the model's input size (its `pretrained_cfg`), then at a second size where the model
takes one (CNNs: the graph's height and width are dynamic too, as optimum's timm export has them)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import torch

# hub options timm's loader takes (the revision as `id@revision`; the token through the environment)
_HUB_OPTIONS = {"revision", "token", "cache_dir", "local_files_only"}


def source(model_id: str, revision: str | None = None) -> str:
    """timm's name of a checkpoint: a directory as `local-dir:`, a hub id as `hf-hub:` (at `revision`)."""
    if Path(model_id).is_dir():
        return f"local-dir:{model_id}"
    return f"hf-hub:{model_id}" + (f"@{revision}" if revision else "")


def load_config(model_id: str, **hub_options):
    """The checkpoint's config.json as a `PretrainedConfig` (what optimum's runtime classes read for timm)."""
    from transformers import PretrainedConfig

    return PretrainedConfig.from_pretrained(model_id, **hub_options)


@contextlib.contextmanager
def _hub_environment(token, local_files_only: bool):
    """timm's downloads read the token and offline mode from huggingface_hub's environment."""
    saved = {k: os.environ.get(k) for k in ("HF_TOKEN", "HF_HUB_OFFLINE")}
    if isinstance(token, str):
        os.environ["HF_TOKEN"] = token
    if local_files_only:
        os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class TimmClassifier(torch.nn.Module):
    """A timm model as a module whose forward takes `pixel_values` by name and returns its `logits`."""

    main_input_name = "pixel_values"

    def __init__(self, model, config):
        super().__init__()
        self.model = model
        self.config = config
        channels, height, _ = model.pretrained_cfg["input_size"]  # what image capture reads (saved in config.json)
        if not hasattr(config, "image_size"):
            config.num_channels, config.image_size = channels, height

    @classmethod
    def from_pretrained(cls, model_id: str, config=None, trust_remote_code: bool = False, **hub_options):
        """The checkpoint's model as timm creates it for export (`exportable=True`), on the CPU. Loading keywords
        timm cannot honour are refused (TypeError), never dropped."""
        import timm

        unknown = {k for k, v in hub_options.items() if k not in _HUB_OPTIONS and v}  # force_download, subfolder
        if unknown:
            raise TypeError(f"timm's loader takes no {', '.join(sorted(unknown))}")
        config = config if config is not None else load_config(model_id, **hub_options)
        with _hub_environment(hub_options.get("token"), hub_options.get("local_files_only", False)):
            model = timm.create_model(source(model_id, hub_options.get("revision")), pretrained=True, exportable=True,
                                      cache_dir=hub_options.get("cache_dir"))
        return cls(model.eval(), config)

    def forward(self, pixel_values: torch.Tensor):
        return {"logits": self.model(pixel_values)}


__all__ = ["TimmClassifier", "load_config", "source"]
