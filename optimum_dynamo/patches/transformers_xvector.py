"""X-vector heads pool a masked batch without a loop over its rows.

Given an attention mask (wav2vec2-bert's extractor always gives one; WavLM's and wav2vec2's speaker-verification
checkpoints ask for it), the x-vector heads of the wav2vec2 family take each row's mean and standard deviation over
its first `length` frames in a Python loop over the rows (`hidden_states[i, :length]`): the loop fixes the batch
the graph takes, and each slice is a tensor's value. The patch masks the frames past each row's length and takes
the same statistics (the unbiased standard deviation, as `.std` gives it); the rest of the head runs as the
original's, in its order. Without a mask, or when the output is asked for as a tuple, the original runs.
(transformers 4.57 to 5.24; 4.x passes the outputs' switches by name, 5 as kwargs.)"""

from __future__ import annotations

import torch

from .registry import original, register_patch

_MODELS = ["wav2vec2.modeling_wav2vec2.Wav2Vec2", "wav2vec2_conformer.modeling_wav2vec2_conformer.Wav2Vec2Conformer",
           "wavlm.modeling_wavlm.WavLM", "unispeech_sat.modeling_unispeech_sat.UniSpeechSat",
           "data2vec.modeling_data2vec_audio.Data2VecAudio"]
_BERT = "wav2vec2_bert.modeling_wav2vec2_bert.Wav2Vec2Bert"  # takes input_features
_REASON = "statistic pooling by a mask of each row's frames, not a loop over the rows"
_V4, _V5 = {"transformers": ">=4.57,<5"}, {"transformers": ">=5"}


def _statistics(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """[mean, std] over each row's first `length` frames (its TDNN output length), as the loop takes them."""
    lengths = self._get_tdnn_output_lengths(self._get_feat_extract_output_lengths(attention_mask.sum(dim=1)))
    frames = torch.arange(hidden_states.shape[1], device=hidden_states.device)
    keep = (frames[None, :] < lengths[:, None]).to(hidden_states.dtype)[..., None]
    count = keep.sum(dim=1)
    mean = (hidden_states * keep).sum(dim=1) / count
    variance = ((hidden_states - mean[:, None]) * keep).pow(2).sum(dim=1) / (count - 1)
    return torch.cat([mean, variance.sqrt()], dim=-1)


def _head(self, inputs, attention_mask, labels, **switches):
    """The x-vector head on the base model's output, the pooling masked."""
    from transformers.modeling_outputs import XVectorOutput

    if self.config.use_weighted_layer_sum:
        switches["output_hidden_states"] = True
    outputs = self.base_model(inputs, attention_mask=attention_mask, return_dict=True, **switches)
    if self.config.use_weighted_layer_sum:
        weights = torch.softmax(self.layer_weights, dim=-1).view(-1, 1, 1)
        hidden_states = (torch.stack(outputs.hidden_states, dim=1) * weights).sum(dim=1)
    else:
        hidden_states = outputs.last_hidden_state
    hidden_states = self.projector(hidden_states)
    for layer in self.tdnn:
        hidden_states = layer(hidden_states)
    embeddings = self.feature_extractor(_statistics(self, hidden_states, attention_mask))
    logits = self.classifier(embeddings)
    return XVectorOutput(loss=None if labels is None else self.objective(logits, labels), logits=logits,
                         embeddings=embeddings, hidden_states=outputs.hidden_states, attentions=outputs.attentions)


def _original(self):
    return original(f"{type(self).__module__}.{type(self).__qualname__}.forward")


def xvector_v4(self, input_values, attention_mask=None, output_attentions=None, output_hidden_states=None,
               return_dict=None, labels=None):
    if attention_mask is None or return_dict is False:
        return _original(self)(self, input_values, attention_mask, output_attentions, output_hidden_states,
                               return_dict, labels)
    return _head(self, input_values, attention_mask, labels, output_attentions=output_attentions,
                 output_hidden_states=output_hidden_states)


def xvector(self, input_values, attention_mask=None, labels=None, **kwargs):
    if attention_mask is None or kwargs.get("return_dict") is False:
        return _original(self)(self, input_values, attention_mask=attention_mask, labels=labels, **kwargs)
    return _head(self, input_values, attention_mask, labels, **{k: v for k, v in kwargs.items() if k != "return_dict"})


def xvector_features_v4(self, input_features, attention_mask=None, output_attentions=None, output_hidden_states=None,
                        return_dict=None, labels=None):
    return xvector_v4(self, input_features, attention_mask, output_attentions, output_hidden_states, return_dict,
                      labels)


def xvector_features(self, input_features, attention_mask=None, labels=None, **kwargs):
    return xvector(self, input_features, attention_mask, labels, **kwargs)


for _model in _MODELS:
    register_patch(f"transformers.models.{_model}ForXVector.forward", versions=_V4, reason=_REASON)(xvector_v4)
    register_patch(f"transformers.models.{_model}ForXVector.forward", versions=_V5, reason=_REASON)(xvector)
register_patch(f"transformers.models.{_BERT}ForXVector.forward", versions=_V4, reason=_REASON)(xvector_features_v4)
register_patch(f"transformers.models.{_BERT}ForXVector.forward", versions=_V5, reason=_REASON)(xvector_features)
