"""Moonshine's masks for any clip length.

- Its convolutions' output length is computed as `int((length - 127) / 64 + 1)` and so on: a float of the clip's
  length truncated, which torch.export can only guard to the captured length (the mask is then sliced to that many
  frames, and another clip's graph indexes past its end). For a length the convolutions accept (>= 127 samples) the
  same numbers come from integer floor division, which stays symbolic. (transformers 4.57 to 5.24 at least.)
- Its decoder takes the clip's mask, as optimum's runtime feeds it, and keeps every 384th sample (the
  convolutions' strides) for its cross-attention, as transformers 4.57's decoder did; transformers 5 downsamples in
  the encoder instead and hands the decoder the encoder output's mask. A mask as long as the encoder's frames is
  taken as it is. (transformers 5.0 to 5.24 at least.)"""

from __future__ import annotations

from .registry import original, register_patch

_LENGTHS = "transformers.models.moonshine.modeling_moonshine.MoonshineEncoder._get_feat_extract_output_lengths"
_DECODER = "transformers.models.moonshine.modeling_moonshine.MoonshineDecoder.forward"
_STRIDE = 64 * 3 * 2  # the encoder's convolution strides


@register_patch(_LENGTHS, versions={"transformers": ">=4.57"},
                reason="the convolutions' output length by integer division, not a truncated float of the clip's length")
def moonshine_output_lengths(self, input_lengths):
    first = (input_lengths - 127) // 64 + 1
    second = (first - 7) // 3 + 1
    return (second - 3) // 2 + 1


@register_patch(_DECODER, versions={"transformers": ">=5"}, check_signature=False,
                reason="the decoder takes the clip's mask (optimum's runtime feeds it) and downsamples it itself")
def moonshine_decoder_clip_mask(self, *args, encoder_hidden_states=None, encoder_attention_mask=None, **kwargs):
    if encoder_attention_mask is not None and encoder_hidden_states is not None:
        frames = encoder_hidden_states.shape[-2]
        if encoder_attention_mask.shape[-1] != frames:
            encoder_attention_mask = encoder_attention_mask[..., ::_STRIDE][..., :frames]
    return original(_DECODER)(self, *args, encoder_hidden_states=encoder_hidden_states,
                              encoder_attention_mask=encoder_attention_mask, **kwargs)
