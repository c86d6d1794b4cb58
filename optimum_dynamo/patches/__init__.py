"""Reversible, version-gated patches applied during export."""

from . import (  # noqa: F401  (register their patches)
    torch_size_tensors,
    transformers_attention,
    transformers_block_mask,
    transformers_canine,
    transformers_complex_rope,
    transformers_deepstack,
    transformers_eos_pooling,
    transformers_funnel,
    transformers_git,
    transformers_gqa,
    transformers_idefics,
    transformers_image_splits,
    transformers_jamba,
    transformers_kept_masks,
    transformers_longformer,
    transformers_mamba,
    transformers_masks,
    transformers_mega,
    transformers_moe,
    transformers_moonshine,
    transformers_packed_audio,
    transformers_packed_vision,
    transformers_positions,
    transformers_recurrent_mask,
    transformers_rwkv,
    transformers_selective_scan,
    transformers_sliding,
    transformers_tf_padding,
    transformers_torch_int,
    transformers_vision_positions,
    transformers_wavlm,
    transformers_xvector,
)
from .registry import Patch, PatchError, active_patches, applied, original, register_patch, unregister_patch

__all__ = ["Patch", "PatchError", "active_patches", "applied", "original", "register_patch", "unregister_patch"]
