"""The processor an image-text-to-text export saved beside its graphs, for the runtime classes to keep (and save
again with `save_pretrained`)."""

from __future__ import annotations

from pathlib import Path


def saved_processors(directory: Path) -> list:
    """The processor saved in `directory`, if any (none where a part of it needs torchvision, not installed)."""
    from transformers import AutoProcessor

    try:
        return [AutoProcessor.from_pretrained(directory)]
    except (OSError, ValueError, KeyError, TypeError, AttributeError, ImportError):  # a part needing torchvision
        return []


__all__ = ["saved_processors"]
