"""GIT (text only): its mask depends on a Python branch `past_key_values_length > 0`.

One graph serves the prefill (empty cache) and the decode steps, but torch.export traces a decode sample,
so the graph kept only the decode branch and the prefill lost its mask. The replacements take the branch
with a tensor condition (`past == 0`) instead, and reproduce eager's two branches:

- transformers 4: the prefill adds the causal mask and the padding mask; a decode step uses neither
  (eager builds the padding mask and drops it).
- transformers 5: a decode step widens the 2D mask by the image tokens (which a text-only cache does not
  hold) and reads its first `past + new` columns; the prefill reads the mask as given.
"""

import torch

from .registry import original, register_patch

_V4 = {"transformers": ">=4.57,<5"}  # measured on 4.57
_V5 = {"transformers": ">=5.23"}  # measured on 5.23
_REASON = "Python branch on the past length -> a tensor condition (the prefill keeps its mask)"
_MODEL_V4 = "transformers.models.git.modeling_git.GitModel.forward"
_MASK_V5 = "transformers.models.git.modeling_git.create_causal_mask"


def _prefill(past) -> torch.Tensor:
    return torch.full((), past) == 0


def text_mask_v4(attention_mask, embeddings, past):
    """GIT's additive mask [batch, 1, new, past + new] of a text-only call: on the prefill -inf above the
    diagonal plus the dtype's minimum on padding, on a decode step zeros."""
    length, dtype = embeddings.shape[1], embeddings.dtype
    keys = torch.arange(attention_mask.shape[1], device=embeddings.device)
    queries = torch.arange(length, device=embeddings.device) + past
    prefill = _prefill(past)
    future = torch.where(prefill & (keys[None, :] > queries[:, None]), float("-inf"), 0.0).to(dtype)
    padding = torch.where(prefill & (attention_mask[:, None, None, :] == 0), torch.finfo(dtype).min, 0.0)
    return future[None, None] + padding.to(dtype)


@register_patch(_MODEL_V4, versions=_V4, reason=_REASON)
def git_text_forward_v4(self, input_ids=None, attention_mask=None, position_ids=None, pixel_values=None,
                        head_mask=None, inputs_embeds=None, past_key_values=None, use_cache=None,
                        output_attentions=None, output_hidden_states=None, interpolate_pos_encoding=False,
                        return_dict=None):
    if pixel_values is not None or input_ids is None or inputs_embeds is not None:  # images: eager's own path
        return original(_MODEL_V4)(self, input_ids, attention_mask, position_ids, pixel_values, head_mask,
                                   inputs_embeds, past_key_values, use_cache, output_attentions,
                                   output_hidden_states, interpolate_pos_encoding, return_dict)
    config = self.config
    past = past_key_values.get_seq_length() if past_key_values is not None else 0
    embeddings = self.embeddings(input_ids=input_ids, position_ids=position_ids, past_key_values_length=past)
    if attention_mask is None:
        attention_mask = torch.ones(input_ids.shape[0], past + input_ids.shape[1], dtype=torch.long,
                                    device=input_ids.device)
    return self.encoder(
        embeddings,
        attention_mask=text_mask_v4(attention_mask, embeddings, past),
        head_mask=self.get_head_mask(head_mask, config.num_hidden_layers),
        past_key_values=past_key_values,
        use_cache=config.use_cache if use_cache is None else use_cache,
        output_attentions=config.output_attentions if output_attentions is None else output_attentions,
        output_hidden_states=config.output_hidden_states if output_hidden_states is None else output_hidden_states,
        return_dict=config.use_return_dict if return_dict is None else return_dict,
        pixel_values_present=False,
    )


@register_patch(_MASK_V5, versions=_V5, reason=_REASON)
def git_causal_mask_v5(config, inputs_embeds, attention_mask, past_key_values, position_ids=None,
                       or_mask_function=None, and_mask_function=None, block_sequence_ids=None, layer_idx=None,
                       allow_is_causal_skip=True):
    if attention_mask is not None and attention_mask.ndim == 2 and past_key_values is not None:
        past = past_key_values.get_seq_length()
        keys = past + inputs_embeds.shape[1]
        # the first `keys` columns on a decode step, the last ones (the mask as given) on the prefill;
        # the same columns when the mask was not widened
        start = (attention_mask.shape[1] - keys) * _prefill(past).long()
        columns = torch.arange(keys, device=attention_mask.device) + start
        attention_mask = attention_mask.index_select(1, columns)
    return original(_MASK_V5)(config, inputs_embeds, attention_mask, past_key_values, position_ids,
                              or_mask_function, and_mask_function, block_sequence_ids, layer_idx,
                              allow_is_causal_skip)
