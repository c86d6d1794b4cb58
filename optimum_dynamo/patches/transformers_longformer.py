"""Longformer's sliding-window attention without data-dependent branches, when no token is global.

`LongformerEncoder.forward` asks the mask whether any token is global (`.any().item()`) and every self-attention
layer branches on the answer: torch.export cannot branch on a tensor's value (GuardOnDataDependentSymNode). The
runtime classes of fill-mask, token classification and feature extraction feed no `global_attention_mask`, and then
(an attention mask of 0/1) no token is global: the local-only path is exact. So `LongformerModel.forward` called
without `global_attention_mask` runs with the layers on the local-only path as a Python `False`; values above 1 in
`attention_mask` (transformers' old way of marking global tokens there) are clamped to 1, so such tokens attend
locally, the same in eager and in the graph, never one path traced and the other taken. With a
`global_attention_mask` (text classification puts one on the first token, question answering, multiple choice)
the original runs untouched. The padding to a multiple of the window is always applied, by 0 where the length is
one already (the original's `if padding_len > 0` fixes whether the graph pads), and the encoder takes the padding
off by a gather of the first positions: a slice of a symbolic part of the length makes torch.export guard on whether
it is contiguous, whether the padding is 0. `_chunk` always overlaps the chunks by `unfold` (5.x's `onnx_export`
branch; 4.57's loops over a chunk count): the same values as the default `as_strided` view, whose chunk count is a
tensor value. (transformers 4.57 to 5.24 at least; 4.x passes a `head_mask`, which 5 dropped.)

LED's encoder is Longformer's, written out in one `LEDEncoder.forward` that pads, branches and unpads itself: it is
run with the same local-only flag and `unfold` chunks, its padding applied by a symbolic length while it is told 0
(so its own `if padding_len > 0` is a Python `False`), and its outputs cut back to the input's length by a gather."""

from __future__ import annotations

import torch

from .registry import original, register_patch

_MODULE = "transformers.models.longformer.modeling_longformer"
_MODEL = f"{_MODULE}.LongformerModel.forward"
_ATTENTION = f"{_MODULE}.LongformerSelfAttention.forward"
_CHUNK = f"{_MODULE}.LongformerSelfAttention._chunk"
_PAD = f"{_MODULE}.LongformerModel._pad_to_window_size"
_ENCODER = f"{_MODULE}.LongformerEncoder.forward"
_REASON = "local-only attention as a Python False when no global_attention_mask is given; chunks by unfold"
_V4, _V5 = {"transformers": ">=4.57,<5"}, {"transformers": ">=5"}

_local_only = [False]  # set while LongformerModel.forward runs without a global_attention_mask


def _model(self, attention_mask, global_attention_mask, **kwargs):
    if global_attention_mask is not None:
        return original(_MODEL)(self, attention_mask=attention_mask, global_attention_mask=global_attention_mask,
                                **kwargs)
    if attention_mask is not None:
        attention_mask = attention_mask.clamp(max=1)
    saved, _local_only[0] = _local_only[0], True
    try:
        return original(_MODEL)(self, attention_mask=attention_mask, **kwargs)
    finally:
        _local_only[0] = saved


@register_patch(_MODEL, versions=_V4, reason=_REASON)
def longformer_forward_v4(self, input_ids=None, attention_mask=None, global_attention_mask=None, head_mask=None,
                          token_type_ids=None, position_ids=None, inputs_embeds=None, output_attentions=None,
                          output_hidden_states=None, return_dict=None):
    return _model(self, attention_mask, global_attention_mask, input_ids=input_ids, head_mask=head_mask,
                  token_type_ids=token_type_ids, position_ids=position_ids, inputs_embeds=inputs_embeds,
                  output_attentions=output_attentions, output_hidden_states=output_hidden_states,
                  return_dict=return_dict)


@register_patch(_MODEL, versions=_V5, reason=_REASON)
def longformer_forward(self, input_ids=None, attention_mask=None, global_attention_mask=None, token_type_ids=None,
                       position_ids=None, inputs_embeds=None, output_attentions=None, output_hidden_states=None,
                       return_dict=None, **kwargs):
    return _model(self, attention_mask, global_attention_mask, input_ids=input_ids, token_type_ids=token_type_ids,
                  position_ids=position_ids, inputs_embeds=inputs_embeds, output_attentions=output_attentions,
                  output_hidden_states=output_hidden_states, return_dict=return_dict, **kwargs)


@register_patch(_ATTENTION, versions=_V4, reason=_REASON)
def longformer_self_attention_v4(self, hidden_states, attention_mask=None, layer_head_mask=None, is_index_masked=None,
                                 is_index_global_attn=None, is_global_attn=None, output_attentions=False):
    return original(_ATTENTION)(self, hidden_states, attention_mask, layer_head_mask, is_index_masked,
                                is_index_global_attn, False if _local_only[0] else is_global_attn, output_attentions)


@register_patch(_ATTENTION, versions=_V5, reason=_REASON)
def longformer_self_attention(self, hidden_states, attention_mask=None, is_index_masked=None,
                              is_index_global_attn=None, is_global_attn=None, output_attentions=False):
    return original(_ATTENTION)(self, hidden_states, attention_mask, is_index_masked, is_index_global_attn,
                                False if _local_only[0] else is_global_attn, output_attentions)


@register_patch(_CHUNK, versions={"transformers": ">=4.57"}, reason=_REASON)
def longformer_chunk(hidden_states, window_overlap, onnx_export=False):
    return hidden_states.unfold(dimension=1, size=window_overlap * 2, step=window_overlap).transpose(2, 3)


def _to_window(config, input_ids, inputs_embeds, embed):
    """(the padding to the next multiple of the attention window, a symbolic length that may be 0; `inputs_embeds`
    with the embeddings of that many pad tokens appended, if given)."""
    window = config.attention_window
    window = window if isinstance(window, int) else max(window)
    batch_size, seq_len = (input_ids if input_ids is not None else inputs_embeds).shape[:2]
    padding_len = (window - seq_len % window) % window
    if inputs_embeds is not None:
        ids = inputs_embeds.new_full((batch_size, padding_len), config.pad_token_id, dtype=torch.long)
        inputs_embeds = torch.cat([inputs_embeds, embed(ids)], dim=-2)
    return padding_len, inputs_embeds


@register_patch(_PAD, versions={"transformers": ">=4.57"}, reason="pad by a symbolic length, 0 included")
def longformer_pad_to_window_size(self, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                                  pad_token_id):
    padding_len, inputs_embeds = _to_window(self.config, input_ids, inputs_embeds, self.embeddings)
    return (padding_len, _pad(input_ids, padding_len, pad_token_id), _pad(attention_mask, padding_len, 0),
            _pad(token_type_ids, padding_len, 0), _pad(position_ids, padding_len, pad_token_id), inputs_embeds)


def _pad(tensor, length, value):
    return None if tensor is None else torch.nn.functional.pad(tensor, (0, length), value=value)


def _first(out, length: int):
    """An encoder output (last_hidden_state, hidden_states, attentions, global_attentions) at the first `length`
    positions, by a gather."""
    keep = torch.arange(length, device=out.last_hidden_state.device)
    cut = lambda states, dim: states and tuple(state.index_select(dim, keep) for state in states)  # noqa: E731
    return type(out)(last_hidden_state=out.last_hidden_state.index_select(1, keep),
                     hidden_states=cut(out.hidden_states, 1), attentions=cut(out.attentions, 2),
                     global_attentions=out.global_attentions)


def _encoder(self, hidden_states, padding_len, return_dict, **kwargs):
    out = original(_ENCODER)(self, hidden_states, padding_len=0, return_dict=True, **kwargs)
    out = _first(out, hidden_states.shape[1] - padding_len)
    return out if return_dict else out.to_tuple()


@register_patch(_ENCODER, versions=_V4, reason="unpadded by a gather, not a slice of symbolic length")
def longformer_encoder_v4(self, hidden_states, attention_mask=None, head_mask=None, padding_len=0,
                          output_attentions=False, output_hidden_states=False, return_dict=True):
    return _encoder(self, hidden_states, padding_len, return_dict, attention_mask=attention_mask, head_mask=head_mask,
                    output_attentions=output_attentions, output_hidden_states=output_hidden_states)


@register_patch(_ENCODER, versions=_V5, reason="unpadded by a gather, not a slice of symbolic length")
def longformer_encoder(self, hidden_states, attention_mask=None, padding_len=0, output_attentions=False,
                       output_hidden_states=False, return_dict=True):
    return _encoder(self, hidden_states, padding_len, return_dict, attention_mask=attention_mask,
                    output_attentions=output_attentions, output_hidden_states=output_hidden_states)


_LED = "transformers.models.led.modeling_led"
_LED_ENCODER = f"{_LED}.LEDEncoder.forward"
_LED_ATTENTION = f"{_LED}.LEDEncoderSelfAttention.forward"
_LED_PAD = f"{_LED}.LEDEncoder._pad_to_window_size"
register_patch(f"{_LED}.LEDEncoderSelfAttention._chunk", versions={"transformers": ">=4.57"},
               reason=_REASON)(longformer_chunk)


def _led_encoder(self, input_ids, attention_mask, global_attention_mask, inputs_embeds, return_dict, **kwargs):
    length = (input_ids if input_ids is not None else inputs_embeds).shape[1]
    local = global_attention_mask is None
    if local and attention_mask is not None:
        attention_mask = attention_mask.clamp(max=1)
    saved, _local_only[0] = _local_only[0], local
    try:
        out = original(_LED_ENCODER)(self, input_ids=input_ids, attention_mask=attention_mask,
                                     global_attention_mask=global_attention_mask, inputs_embeds=inputs_embeds,
                                     return_dict=True, **kwargs)
    finally:
        _local_only[0] = saved
    out = _first(out, length)
    return out if (self.config.return_dict if return_dict is None else return_dict) else out.to_tuple()


@register_patch(_LED_ENCODER, versions=_V4, reason=_REASON)
def led_encoder_v4(self, input_ids=None, attention_mask=None, global_attention_mask=None, head_mask=None,
                   inputs_embeds=None, output_attentions=None, output_hidden_states=None, return_dict=None):
    return _led_encoder(self, input_ids, attention_mask, global_attention_mask, inputs_embeds, return_dict,
                        head_mask=head_mask, output_attentions=output_attentions,
                        output_hidden_states=output_hidden_states)


@register_patch(_LED_ENCODER, versions=_V5, reason=_REASON)
def led_encoder(self, input_ids=None, attention_mask=None, global_attention_mask=None, inputs_embeds=None,
                output_attentions=None, output_hidden_states=None, return_dict=None, **kwargs):
    return _led_encoder(self, input_ids, attention_mask, global_attention_mask, inputs_embeds, return_dict,
                        output_attentions=output_attentions, output_hidden_states=output_hidden_states, **kwargs)


@register_patch(_LED_ATTENTION, versions=_V4, reason=_REASON)
def led_self_attention_v4(self, hidden_states, attention_mask=None, layer_head_mask=None, is_index_masked=None,
                          is_index_global_attn=None, is_global_attn=None, output_attentions=False):
    return original(_LED_ATTENTION)(self, hidden_states, attention_mask, layer_head_mask, is_index_masked,
                                    is_index_global_attn, False if _local_only[0] else is_global_attn,
                                    output_attentions)


@register_patch(_LED_ATTENTION, versions=_V5, reason=_REASON)
def led_self_attention(self, hidden_states, attention_mask=None, is_index_masked=None, is_index_global_attn=None,
                       is_global_attn=None, output_attentions=False):
    return original(_LED_ATTENTION)(self, hidden_states, attention_mask, is_index_masked, is_index_global_attn,
                                    False if _local_only[0] else is_global_attn, output_attentions)


@register_patch(_LED_PAD, versions={"transformers": ">=4.57"}, reason="pad by a symbolic length, told 0")
def led_pad_to_window_size(self, input_ids, attention_mask, inputs_embeds, pad_token_id):
    padding_len, inputs_embeds = _to_window(self.config, input_ids, inputs_embeds, self.embed_tokens)
    return 0, _pad(input_ids, padding_len, pad_token_id), _pad(attention_mask, padding_len, 0), inputs_embeds
