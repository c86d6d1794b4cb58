"""Speech seq2seq models on a Parakeet encoder (NVIDIA Canary, Cohere ASR): the decoder takes the clip's mask.

Their model hands the decoder the mask its encoder subsampled (`encoder_outputs.attention_mask`, one per encoder
frame); optimum's `ORTModelForSpeechSeq2Seq` feeds the decoder graph the mask of the input features. Given encoder
outputs whose mask is longer than their frames, the model subsamples it as its encoder does (the encoder's
`_get_output_attention_mask`); a mask as long as the frames is taken as it is. (transformers 5.4 (Cohere ASR) and
5.17 (Canary) to 5.24 at least.)"""

from __future__ import annotations

from .registry import original, register_patch

_CANARY = "transformers.models.canary.modeling_canary.CanaryModel.forward"
_COHERE_ASR = "transformers.models.cohere_asr.modeling_cohere_asr.CohereAsrModel.forward"
_REASON = "the decoder graph takes the clip's mask (optimum's runtime feeds it): subsampled as the encoder does"


def frames_mask(model, encoder_outputs):
    """`encoder_outputs` with its mask brought to one value per encoder frame."""
    mask = getattr(encoder_outputs, "attention_mask", None)
    states = getattr(encoder_outputs, "last_hidden_state", None)
    if mask is None or states is None or mask.shape[-1] == states.shape[-2]:
        return encoder_outputs
    frames = model.encoder._get_output_attention_mask(mask, target_length=states.shape[-2])
    return type(encoder_outputs)(**{**encoder_outputs, "attention_mask": frames.int()})


@register_patch(_CANARY, versions={"transformers": ">=5.17"}, check_signature=False, reason=_REASON)
def canary_clip_mask(self, *args, encoder_outputs=None, **kwargs):
    return original(_CANARY)(self, *args, encoder_outputs=frames_mask(self, encoder_outputs), **kwargs)


@register_patch(_COHERE_ASR, versions={"transformers": ">=5.4"}, check_signature=False, reason=_REASON)
def cohere_asr_clip_mask(self, *args, encoder_outputs=None, **kwargs):
    return original(_COHERE_ASR)(self, *args, encoder_outputs=frames_mask(self, encoder_outputs), **kwargs)
