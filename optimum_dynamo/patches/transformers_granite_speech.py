"""Granite Speech's conformer and projector with any number of frames.

Both cut the frames into blocks (the conformer's attention context, the projector's windows) after padding them to
a whole number of blocks. The attention pads and masks its last block only when the frames leave a remainder (a
Python branch on the number of frames, which torch.export fixes: a graph traced with a remainder masks a whole
block on inputs without one), and both count blocks with `math.ceil`, whose symbolic sizes torch's ONNX
decompositions cannot prove equal to the padded lengths. Here the blocks are counted by floor division, the frames
padded by what is missing (0 included), and the padded keys of the last block masked with tensor ops: the kept
frames get the model's own values (its mask hides the same keys from them). (transformers 5.0 to 5.24 at least;
4.57's attention keeps blocks in a dimension of their own.)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .registry import register_patch

_MODULE = "transformers.models.granite_speech.modeling_granite_speech"
_PLUS = "transformers.models.granite_speech_plus.modeling_granite_speech_plus"  # Granite Speech Plus: the same code
_VERSIONS = {"transformers": ">=5.0"}


def _blocks(frames, size: int):
    """The number of blocks of `size` that hold `frames`, and the padding that fills the last one."""
    blocks = (frames + size - 1) // size
    return blocks, blocks * size - frames


@register_patch(f"{_MODULE}.GraniteSpeechConformerAttention.forward", versions=_VERSIONS,
                reason="blocks of any number of frames: the last block's padded keys masked with tensor ops")
@register_patch(f"{_PLUS}.GraniteSpeechPlusConformerAttention.forward", versions=_VERSIONS,
                reason="blocks of any number of frames: the last block's padded keys masked with tensor ops")
def conformer_blocks(self, hidden_states, attention_dists):
    hidden_states = self.pre_norm(hidden_states)
    bsz, frames, _ = hidden_states.shape
    blocks, pad = _blocks(frames, self.context_size)
    hidden_states = F.pad(hidden_states, (0, 0, 0, pad))
    query = self.to_q(hidden_states)
    key, value = self.to_kv(hidden_states).chunk(2, dim=-1)
    # blocks in a dimension of their own (as transformers 4.57 kept them): no size split to merge back
    query, key, value = (t.reshape(bsz, blocks, self.context_size, self.num_heads, -1).transpose(2, 3)
                         for t in (query, key, value))
    rel_pos_emb = self.rel_pos_emb(attention_dists)
    pos_attn = torch.einsum("b m h c d, c r d -> b m h c r", query, rel_pos_emb) * self.scale
    padded = torch.arange(blocks * self.context_size, device=hidden_states.device) >= frames
    pos_attn = pos_attn.masked_fill(padded.reshape(1, blocks, 1, 1, self.context_size),
                                    -torch.finfo(pos_attn.dtype).max).expand(bsz, -1, -1, -1, -1)
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):  # 4-d, as the ONNX translation takes it
        out = F.scaled_dot_product_attention(query.flatten(0, 1), key.flatten(0, 1), value.flatten(0, 1),
                                             attn_mask=pos_attn.flatten(0, 1), scale=self.scale)
    out = out.unflatten(0, (bsz, blocks)).transpose(2, 3).reshape(bsz, blocks * self.context_size, -1)
    return self.dropout(self.to_out(out[:, :frames, :]))


@register_patch(f"{_MODULE}.GraniteSpeechEncoderProjector.forward", versions=_VERSIONS,
                reason="windows of any number of frames, counted by floor division")
@register_patch(f"{_PLUS}.GraniteSpeechPlusEncoderProjector.forward", versions=_VERSIONS,
                reason="windows of any number of frames, counted by floor division")
def projector_windows(self, hidden_states):
    batch_size, frames, dim = hidden_states.shape
    blocks, pad = _blocks(frames, self.window_size)
    hidden_states = F.pad(hidden_states, (0, 0, 0, pad)).reshape(batch_size * blocks, self.window_size, dim)
    out = self.qformer(query_embeds=self.query, encoder_hidden_states=hidden_states, encoder_attention_mask=None,
                       return_dict=True)
    return self.linear(out.last_hidden_state.reshape(batch_size, blocks * self.window_size // self.downsample_rate, -1))
