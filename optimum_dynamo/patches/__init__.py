"""Reversible, version-gated patches applied during export."""

from . import transformers_attention, transformers_masks, transformers_moe, transformers_sliding  # noqa: F401
from .registry import Patch, PatchError, active_patches, applied, original, register_patch, unregister_patch

__all__ = ["Patch", "PatchError", "active_patches", "applied", "original", "register_patch", "unregister_patch"]
