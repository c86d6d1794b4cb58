"""DeepStack's features added by a masked scatter (Qwen3-VL and the text models built like it).

These text models add features of the vision tower's early layers to the hidden states of their first
layers at the image positions: `hidden_states[visual_pos_masks] += visual_embeds`, a boolean index whose
size is data-dependent in torch.export. The patch scatters the rows into zeros at the masked positions
and adds that: `x + 0` is `x`, so the sum is the model's, bit for bit, and every shape stays static.
"""

import torch

from .registry import register_patch

_CLASSES = [
    "transformers.models.qwen3_vl.modeling_qwen3_vl.Qwen3VLTextModel",
    "transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe.Qwen3VLMoeTextModel",
    "transformers.models.cohere_compass.modeling_cohere_compass.CohereCompassTextModel",
    "transformers.models.granite_docling.modeling_granite_docling.GraniteDoclingTextModel",
]


@register_patch(f"{_CLASSES[0]}._deepstack_process", versions={"transformers": ">=4.57"}, reason="dense deepstack add")
@register_patch(f"{_CLASSES[1]}._deepstack_process", versions={"transformers": ">=4.57"}, reason="dense deepstack add")
@register_patch(f"{_CLASSES[2]}._deepstack_process", versions={"transformers": ">=5.16"}, reason="dense deepstack add")
@register_patch(f"{_CLASSES[3]}._deepstack_process", versions={"transformers": ">=5.23"}, reason="dense deepstack add")
def deepstack_by_scatter(self, hidden_states: torch.Tensor, visual_pos_masks: torch.Tensor, visual_embeds: torch.Tensor):
    mask = visual_pos_masks.to(hidden_states.device)[..., None].expand_as(hidden_states)
    rows = torch.zeros_like(hidden_states).masked_scatter(mask, visual_embeds.to(hidden_states.device, hidden_states.dtype))
    return hidden_states + rows
