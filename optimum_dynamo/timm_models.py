"""timm image classifiers (`--library-name timm`, or inferred as optimum infers it: a config.json with timm's
`pretrained_cfg`): the model timm builds from the checkpoint, pixel values in, `logits` out. The export's config.json
is the checkpoint's (with the input size the capture read), so optimum's `ORTModelForImageClassification` loads it as
it loads a timm export of its own.

The capture feeds pixel values at the model's input size (its `pretrained_cfg`), then at a second size where the model
takes one (CNNs: the graph's height and width are dynamic too, as optimum's timm export has them)."""

from __future__ import annotations

from pathlib import Path

import torch

# the weight files timm's loader reads from a directory, in its order of preference
WEIGHTS = ("model.safetensors", "pytorch_model.bin")


def local_directory(model_id: str, **hub_options) -> Path:
    """The checkpoint's directory: a hub id's config.json and weights fetched by huggingface_hub (every hub option
    honoured by it: revision, token, cache_dir, subfolder, local_files_only, force_download), the files timm's
    `local-dir:` loader reads; a directory as it is (its `subfolder`)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    if Path(model_id).is_dir():
        return Path(model_id) / (hub_options.get("subfolder") or "")
    config = Path(hf_hub_download(model_id, "config.json", **hub_options))
    for name in WEIGHTS:
        try:
            hf_hub_download(model_id, name, **hub_options)
            break
        except EntryNotFoundError:  # not in the repo (or, offline, not cached): the next format
            continue
    return config.parent


def load_config(model_id: str, **hub_options):
    """The checkpoint's config.json as a `PretrainedConfig` (what optimum's runtime classes read for timm)."""
    from transformers import PretrainedConfig

    return PretrainedConfig.from_pretrained(model_id, **hub_options)


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
        """The checkpoint's model as timm creates it for export (`exportable=True`), on the CPU."""
        import timm

        config = config if config is not None else load_config(model_id, **hub_options)
        directory = local_directory(model_id, **hub_options)
        return cls(timm.create_model(f"local-dir:{directory}", pretrained=True, exportable=True).eval(), config)

    def forward(self, pixel_values: torch.Tensor):
        return {"logits": self.model(pixel_values)}


__all__ = ["TimmClassifier", "WEIGHTS", "load_config", "local_directory"]
