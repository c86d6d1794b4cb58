"""Encoder-decoder image-text-to-text models (T5Gemma 2): optimum's `ORTModelForSeq2SeqLM` whose encoder also
takes the prompt's `pixel_values` (`exporters/vision_language/seq2seq.py` writes the directory), and whose prompts without an
image go to `text_encoder_model.onnx` where the export wrote one.

`ORTModelForImageTextToText.from_pretrained` returns this class for a directory whose config is an encoder-decoder's:

    model = ORTModelForImageTextToText.from_pretrained("out")
    tokens = model.generate(**processor(images=images, text=prompts, return_tensors="pt", padding=True))
"""

from __future__ import annotations

import torch
from onnxruntime import InferenceSession
from optimum.onnxruntime import ORTModelForSeq2SeqLM
from optimum.onnxruntime.modeling_seq2seq import ORTEncoder
from optimum.onnxruntime.utils import prepare_providers_and_provider_options
from transformers import AutoModelForImageTextToText
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqLMOutput

from .processors import saved_processors

TEXT_ENCODER_FILE = "text_encoder_model.onnx"  # the encoder on prompts without an image (exporters/seq2seq.py)
ENCODER_WEIGHTS = "encoder_weights.onnx_data"  # its weights and the encoder's, stored once (exporters/vision_language/seq2seq.py)


class ORTEncoderWithImages(ORTEncoder):
    """The encoder graph on the prompt's ids, mask and pixels; a prompt without pixels goes to `text_encoder`, the
    encoder graph of such prompts where the export has one."""

    text_encoder: ORTEncoder | None = None

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, pixel_values: torch.Tensor | None = None,
                **kwargs) -> BaseModelOutput:
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if "pixel_values" in self.input_names:
            if pixel_values is None and self.text_encoder is not None:
                return self.text_encoder(input_ids=input_ids, attention_mask=attention_mask)
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
    export_task = "image-text-to-text"  # optimum's registry reads the auto class as image-to-text on transformers 5
    _ort_encoder_class = ORTEncoderWithImages

    @classmethod
    def _from_pretrained(cls, model_id, config, subfolder: str = "", revision: str = "main",
                         force_download: bool = False, local_files_only: bool = False, token=None, cache_dir=None,
                         provider: str = "CPUExecutionProvider", providers=None, provider_options=None,
                         session_options=None, **kwargs):
        """optimum's three graphs, `text_encoder_model.onnx` where the export wrote one, and the processor."""
        hub = dict(subfolder=subfolder, revision=revision, force_download=force_download,
                   local_files_only=local_files_only, token=token, **({"cache_dir": cache_dir} if cache_dir else {}))
        try:  # the two encoder graphs' shared weights, beside them (a download from the Hub)
            cls._cached_file(model_id, filename=ENCODER_WEIGHTS, **hub)
        except OSError:  # an export with one encoder graph: its weights are its own
            pass
        model = super()._from_pretrained(model_id, config, provider=provider, providers=providers,
                                         provider_options=provider_options, session_options=session_options,
                                         **hub, **kwargs)
        if not model.preprocessors:  # saved again by `save_pretrained`, as the other layouts' are
            model.preprocessors = saved_processors(model.model_save_dir)
        try:
            path = cls._cached_file(model_id, filename=TEXT_ENCODER_FILE, **hub)
        except OSError:  # an export without one: such prompts are refused in one line
            return model
        providers, provider_options = prepare_providers_and_provider_options(
            provider=provider, providers=providers, provider_options=provider_options)
        session = InferenceSession(path, providers=providers, provider_options=provider_options,
                                   sess_options=session_options)
        model.encoder.text_encoder = ORTEncoder(config=config, session=session, use_io_binding=model.use_io_binding)
        return model

    def _save_pretrained(self, save_directory):
        super()._save_pretrained(save_directory)
        if self.encoder.text_encoder is not None:
            self.encoder.text_encoder.save_session(save_directory)

    def forward(self, input_ids=None, attention_mask=None, pixel_values=None, encoder_outputs=None,
                **kwargs) -> Seq2SeqLMOutput:
        if encoder_outputs is None:
            encoder_outputs = self.encoder(input_ids=input_ids, attention_mask=attention_mask,
                                           pixel_values=pixel_values)
        return super().forward(input_ids=input_ids, attention_mask=attention_mask, encoder_outputs=encoder_outputs,
                               **kwargs)


__all__ = ["ORTEncoderWithImages", "ORTModelForImageTextToTextSeq2Seq"]
