"""Encoder-decoder vision-language models (T5Gemma 2): `--task image-text-to-text` in optimum's seq2seq layout.

The image is read by the encoder (its features replace the image-token rows of the prompt's embeddings), so the
encoder graph takes `pixel_values` beside `input_ids` and `attention_mask`; the decoder graphs are the seq2seq
ones (`exporters/seq2seq.py`). The observation runs `generate` on the checkpoint's processor's prompts with one
image each (a batch of 1, then a left-padded batch of 2), then on prompts without an image where the model takes
them: their encoder calls make `text_encoder_model.onnx`, the same encoder without `pixel_values`; the two encoder
graphs then read their weights from one file, `encoder_weights.onnx_data` (`shared_weights`).
`optimum_dynamo.ORTModelForImageTextToText` loads the directory (an encoder-decoder runtime whose encoder takes the
pixels).
"""

from __future__ import annotations

from ...capture.drivers import drive_seq2seq_generation
from ..base import ExportContext
from ..seq2seq import TEXT_ENCODER, Seq2SeqOnnxExporter
from ..shared_weights import share_component_weights
from .exporter import load_processor
from .image_features import default_image
from .prompts import default_prompt, processor_inputs, text_batches

ENCODER_WEIGHTS = "encoder_weights.onnx_data"  # the two encoder graphs' external data, when there are two


def image_text_batches(model, processor) -> list[dict]:
    """Two batches of encoder inputs: one prompt with its image, then two prompts of other lengths (left-padded)
    with an image each."""
    prompt = default_prompt(processor, model.config)
    processor.tokenizer.padding_side = "left"
    first = processor_inputs(model, processor, [[default_image(seed=1)]], [prompt])
    second = processor_inputs(model, processor, [[default_image(seed=2)], [default_image(seed=3)]],
                              [prompt, f"a longer prompt: {prompt} jumps over the lazy dog"], padding=True)
    return [first, second]


class Seq2SeqVlmOnnxExporter(Seq2SeqOnnxExporter):
    """The seq2seq exporter, observing the model on the processor's image and prompt batches."""

    def load(self, ctx: ExportContext) -> None:
        processor = load_processor(ctx.target.model_id, ctx.target.config, ctx.options.loading)  # before the weights
        super().load(ctx)
        ctx.processor = processor

    def with_past(self, ctx: ExportContext) -> bool:
        return True  # the task has no "-with-past" variant: generation always keeps a cache

    def drive(self, ctx: ExportContext) -> None:
        drive_seq2seq_generation(ctx.model, batches=image_text_batches(ctx.model, ctx.processor))
        if batches := text_batches(ctx.model, ctx.processor):  # the model takes prompts without an image
            drive_seq2seq_generation(ctx.model, batches=batches)

    def save(self, ctx: ExportContext) -> None:
        super().save(ctx)
        encoders = [part for part in ctx.components if part.name in ("encoder_model", TEXT_ENCODER)]
        if len(encoders) == 2:  # the text encoder's weights are the encoder's: stored once
            share_component_weights(ctx.staging, encoders, ENCODER_WEIGHTS)


__all__ = ["Seq2SeqVlmOnnxExporter", "image_text_batches"]
