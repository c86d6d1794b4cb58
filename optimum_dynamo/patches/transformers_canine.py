"""CANINE's character sequence length stays an axis.

Three places fix the length torch.export traces: the molecule mask is pooled by `MaxPool1d` (its size check
specializes the length), the initial local attention loops `range(0, length, stride)` over chunks, and the
molecules are repeated back to characters by a count made from the length. The patches pool with `max_pool2d` (a
row of the same windows), gather each character's molecule by index, and run the local attention over the whole
sequence with the keys outside each query's chunk at -inf: every row's softmax is its chunk's, so the outputs are
the chunked ones (the scores are length x length, as the final character encoder's already are). The molecule
mask comes out (batch, molecules) on every version (4.57 squeezed dim -1, a no-op but for one molecule; the
extended mask is the same). Local attention with other chunk settings than CanineModel's or `output_attentions`
is left to the original. (transformers 4.57 to 5.24 at least; the attention lost `head_mask` in 5.)"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .registry import original, register_patch

_MODEL = "transformers.models.canine.modeling_canine.CanineModel"
_POOL = f"{_MODEL}._downsample_attention_mask"
_REPEAT = f"{_MODEL}._repeat_molecules"
_ATTENTION = "transformers.models.canine.modeling_canine.CanineAttention.forward"
_REASON = "the character length as a size: no max_pool1d size check, no loop over chunks, no repeat count"


@register_patch(_POOL, versions={"transformers": ">=4.57"}, reason=_REASON)
def canine_pooled_mask(self, char_attention_mask, downsampling_rate):
    # max_pool2d's size rule is symbolic, max_pool1d's is not
    rows = char_attention_mask.float()[:, None, None, :]
    return F.max_pool2d(rows, (1, downsampling_rate), (1, downsampling_rate)).flatten(1)


@register_patch(_REPEAT, versions={"transformers": ">=4.57"}, reason=_REASON)
def canine_repeat_molecules(self, molecules, char_seq_length):
    # character i takes molecule i // rate + 1 (after [CLS]), the last molecule for the remainder
    positions = torch.arange(char_seq_length, device=molecules.device) // self.config.downsampling_rate + 1
    return molecules.index_select(1, positions.clamp(max=molecules.shape[1] - 1))


def _chunked(attention, attention_mask, output_attentions) -> bool:
    """CanineModel's local attention: from- and to-chunks alike, no extra first position."""
    width = attention.attend_from_chunk_width
    return (attention.local and not output_attentions and not attention.always_attend_to_first_position
            and not attention.first_position_attends_to_all
            and width == attention.attend_from_chunk_stride == attention.attend_to_chunk_width
            == attention.attend_to_chunk_stride and (attention_mask is None or attention_mask.ndim == 3))


def _block_bias(attention, hidden_states, attention_mask):
    """The 3D mask as the self-attention's bias, keys outside the query's chunk at -inf: attention over the whole
    sequence is then the chunks' own (no chunk axis: torch.export would guard on its size being 1)."""
    batch, length, _ = hidden_states.shape
    chunk = torch.arange(length, device=hidden_states.device) // attention.attend_from_chunk_width
    mask = hidden_states.new_ones(()) if attention_mask is None else attention_mask.float()
    bias = (1.0 - mask.expand(batch, length, length)) * torch.finfo(hidden_states.dtype).min
    return bias.masked_fill(chunk[:, None] != chunk[None, :], float("-inf"))[:, None]


@register_patch(_ATTENTION, versions={"transformers": ">=5"}, reason=_REASON)
def canine_attention(self, hidden_states, attention_mask=None, output_attentions=False):
    if not _chunked(self, attention_mask, output_attentions):
        return original(_ATTENTION)(self, hidden_states, attention_mask, output_attentions)
    bias = _block_bias(self, hidden_states, attention_mask)
    return (self.output(self.self(hidden_states, hidden_states, bias)[0], hidden_states),)


@register_patch(_ATTENTION, versions={"transformers": ">=4.57,<5"}, reason=_REASON)
def canine_attention_v4(self, hidden_states, attention_mask=None, head_mask=None, output_attentions=False):
    if not _chunked(self, attention_mask, output_attentions):
        return original(_ATTENTION)(self, hidden_states, attention_mask, head_mask, output_attentions)
    bias = _block_bias(self, hidden_states, attention_mask)
    return (self.output(self.self(hidden_states, hidden_states, bias, head_mask)[0], hidden_states),)
