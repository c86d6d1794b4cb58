"""Encoder-decoder image-text-to-text models (T5Gemma 2): optimum's `ORTModelForSeq2SeqLM` whose encoder also
takes the prompt's `pixel_values` (`exporters/vlm_seq2seq.py` writes the directory).

`ORTModelForImageTextToText.from_pretrained` returns this class for a directory whose config is an encoder-decoder's:

    model = ORTModelForImageTextToText.from_pretrained("out")
    tokens = model.generate(**processor(images=images, text=prompts, return_tensors="pt", padding=True))
"""

from __future__ import annotations

import torch
from optimum.onnxruntime import ORTModelForSeq2SeqLM
from optimum.onnxruntime.modeling_seq2seq import ORTEncoder
from transformers import AutoModelForImageTextToText
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqLMOutput


class ORTEncoderWithImages(ORTEncoder):
    """The encoder graph on the prompt's ids, mask and pixels."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, pixel_values: torch.Tensor | None = None,
                **kwargs) -> BaseModelOutput:
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if "pixel_values" in self.input_names:
            if pixel_values is None:
                raise ValueError("this export's encoder reads an image with every prompt: pass the processor's "
                                 "pixel_values (a prompt without an image is not supported by this export)")
            inputs["pixel_values"] = pixel_values
        use_torch = isinstance(input_ids, torch.Tensor)
        outputs = self._prepare_onnx_outputs(
            use_torch, self.session.run(None, self._prepare_onnx_inputs(use_torch, inputs)))
        return BaseModelOutput(last_hidden_state=outputs["last_hidden_state"])


class ORTModelForImageTextToTextSeq2Seq(ORTModelForSeq2SeqLM):
    """An encoder-decoder image-text-to-text export: the encoder reads the prompt and its image, the decoder
    generates."""

    auto_model_class = AutoModelForImageTextToText
    _ort_encoder_class = ORTEncoderWithImages

    def forward(self, input_ids=None, attention_mask=None, pixel_values=None, encoder_outputs=None,
                **kwargs) -> Seq2SeqLMOutput:
        if encoder_outputs is None:
            encoder_outputs = self.encoder(input_ids=input_ids, attention_mask=attention_mask,
                                           pixel_values=pixel_values)
        return super().forward(input_ids=input_ids, attention_mask=attention_mask, encoder_outputs=encoder_outputs,
                               **kwargs)


__all__ = ["ORTEncoderWithImages", "ORTModelForImageTextToTextSeq2Seq"]
