"""Idefics (1) on transformers 4: its attention reads the past's length as the value of `cache_position[0]`.

`kv_seq_len += cache_position[0]` makes the rotary table's length a tensor's value, and `max(kv_seq_len, q_len)`
then guards on data (torch.export: "Could not guard on data-dependent expression"). Before the cache update,
`cache_position[0]` is the layer's past length, which the cache knows as a size: the replacement passes that
instead (the cache ignores `cache_position`; nothing else in the attention reads it)."""

from .registry import original, register_patch

_V4 = {"transformers": ">=4.57,<5"}  # measured on 4.57; transformers 5 reads no cache_position there
_ATTENTION = "transformers.models.idefics.modeling_idefics.IdeficsAttention.forward"


@register_patch(_ATTENTION, versions=_V4, reason="the past's length from cache_position's value -> the cache's size")
def idefics_attention_past_length(self, hidden_states, key_value_states=None, attention_mask=None, position_ids=None,
                                  past_key_values=None, cache_position=None, **kwargs):
    if past_key_values is not None and cache_position is not None:
        cache_position = (past_key_values.get_seq_length(self.layer_idx),)
    return original(_ATTENTION)(self, hidden_states, key_value_states, attention_mask, position_ids,
                                past_key_values, cache_position, **kwargs)
