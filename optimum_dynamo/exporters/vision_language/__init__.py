"""Vision-language exports (`image-text-to-text`): vision encoder, projector, token embedding and text decoder
graphs (`exporter`), a prompt graph and a decode-step graph of the model's own forward (`steps`), the encoder-decoder
layout (`seq2seq`), the image paths (`image_features`, `image_tiles`, `grid_tower_v4`) and the prompts (`prompts`)."""

from .exporter import VlmOnnxExporter, default_image, export_vlm, observe_vlm
from .prompts import default_prompt, image_placeholder, processor_inputs

__all__ = ["VlmOnnxExporter", "default_image", "default_prompt", "export_vlm", "image_placeholder", "observe_vlm",
           "processor_inputs"]
