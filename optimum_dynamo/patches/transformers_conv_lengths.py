"""Moonshine's encoder length for any clip length.

Its convolutions' output length is computed as `int((length - 127) / 64 + 1)` and so on: a float of the clip's
length truncated, which torch.export can only guard to the captured length (the mask is then sliced to that many
frames, and another clip's graph indexes past its end). For a length the convolutions accept (>= 127 samples) the
same numbers come from integer floor division, which stays symbolic. (transformers 4.57 to 5.24 at least.)"""

from __future__ import annotations

from .registry import register_patch

_TARGET = "transformers.models.moonshine.modeling_moonshine.MoonshineEncoder._get_feat_extract_output_lengths"
_REASON = "the convolutions' output length by integer division, not a truncated float of the clip's length"


@register_patch(_TARGET, versions={"transformers": ">=4.57"}, reason=_REASON)
def moonshine_output_lengths(self, input_lengths):
    first = (input_lengths - 127) // 64 + 1
    second = (first - 7) // 3 + 1
    return (second - 3) // 2 + 1
