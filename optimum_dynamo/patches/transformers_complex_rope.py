"""Rotary embeddings computed in complex numbers (Llama 4): `torch.polar` / `view_as_complex` have no ONNX
type to go to. During export the rotary module returns each frequency as a real (cos, sin) pair and the
rotation multiplies the pairs out: the same numbers, real arithmetic."""

import torch

from .registry import original, register_patch

_VERSIONS = {"transformers": ">=4.51"}
_REASON = "complex rotary embedding -> real (cos, sin) pairs (ONNX has no complex tensors)"
_ROTARY = "transformers.models.llama4.modeling_llama4.Llama4TextRotaryEmbedding.forward"


@register_patch(_ROTARY, versions=_VERSIONS, reason=_REASON)
def llama4_real_rotary(self, x, position_ids):
    if "dynamic" in getattr(self, "rope_type", "") or "longrope" in getattr(self, "rope_type", ""):
        return torch.view_as_real(original(_ROTARY)(self, x, position_ids))  # inv_freq updated per call
    freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
    return torch.stack([freqs.cos(), freqs.sin()], dim=-1) * self.attention_scaling


def _rotate(x: torch.Tensor, pairs_of_freqs: torch.Tensor) -> torch.Tensor:
    pairs = x.float().reshape(*x.shape[:-1], -1, 2)
    cos, sin = pairs_of_freqs[:, :, None, :, 0], pairs_of_freqs[:, :, None, :, 1]
    real = pairs[..., 0] * cos - pairs[..., 1] * sin
    imag = pairs[..., 0] * sin + pairs[..., 1] * cos
    return torch.stack([real, imag], dim=-1).flatten(3).type_as(x)


@register_patch("transformers.models.llama4.modeling_llama4.apply_rotary_emb", versions=_VERSIONS, reason=_REASON)
def llama4_real_rotary_apply(xq, xk, freqs_cis):
    return _rotate(xq, freqs_cis), _rotate(xk, freqs_cis)
