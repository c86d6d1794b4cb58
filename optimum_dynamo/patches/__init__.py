"""Reversible, version-gated patches applied during export."""

from . import transformers_mamba, transformers_masks, transformers_moe, transformers_recurrent_mask  # noqa: F401  (register their patches)
from .registry import Patch, PatchError, active_patches, applied, original, register_patch, unregister_patch

__all__ = ["Patch", "PatchError", "active_patches", "applied", "original", "register_patch", "unregister_patch"]
