"""`ORTModelForSpeechLM`: a speech LLM's components (`exporters/speech_language.py`) as one optimum ORTModel with
transformers' `generate`, on batches of clips with left-padded prompts. optimum's `ORTModelForSpeechSeq2Seq`
returns it for such a directory (legacy_bridge.ort_speech_lm), so users load it as they load Whisper:

    model = ORTModelForSpeechSeq2Seq.from_pretrained("out")
    processor = AutoProcessor.from_pretrained("out")
    tokens = model.generate(**processor.apply_transcription_request(clips))

The prefill runs `audio_features` on the processor's features (and their mask): one row per audio token, which
replace those tokens' embeddings; the decoder and the decode steps are the vision-language runtime's.
"""

from __future__ import annotations

import torch
from transformers import AutoModelForSeq2SeqLM
from transformers.modeling_outputs import CausalLMOutputWithPast

from .image_text_to_text import ORTModelForImageTextToText

LAYOUT_FILE = "speech_lm.json"


class ORTModelForSpeechLM(ORTModelForImageTextToText):
    """A speech LLM (GLM-ASR, AudioFlamingo 3, Voxtral, ...) exported per component, run by onnxruntime."""

    auto_model_class = AutoModelForSeq2SeqLM
    export_task = "automatic-speech-recognition"
    main_input_name = "input_ids"
    layout_file = LAYOUT_FILE

    def audio_rows(self, audio: dict[str, torch.Tensor]) -> torch.Tensor:
        """The rows of the clips' audio tokens, from the processor's audio tensors the graph takes."""
        graph = self.components["audio_features"]
        missing = [name for name in graph.input_names if audio.get(name) is None]
        if missing:
            raise ValueError(f"this model's audio graph needs {', '.join(missing)} (the processor's)")
        return graph(**{name: audio[name] for name in graph.input_names})["output"]

    def forward(self, input_ids: torch.LongTensor, attention_mask: torch.LongTensor | None = None,
                past_key_values: tuple | None = None, position_ids: torch.LongTensor | None = None,
                use_cache: bool | None = None, **audio) -> CausalLMOutputWithPast:
        embeds = self.embed(input_ids)
        if past_key_values is None:  # the prefill: the clips' rows at the audio tokens
            is_audio = input_ids == self.layout["audio_token_id"]
            given = {k: v for k, v in audio.items() if k in self.layout["audio_inputs"] and v is not None}
            if is_audio.any() or given:
                feed = {"input_ids": input_ids, "attention_mask": attention_mask, **given}  # MusicFlamingo reads the ids
                rows = self.audio_rows({k: feed.get(k) for k in self.layout["audio_inputs"]})
                if rows.shape[0] != is_audio.sum():
                    raise ValueError(f"{int(is_audio.sum())} audio tokens in the prompt but {rows.shape[0]} audio features")
                embeds[is_audio] = rows.to(embeds.dtype)
        return self.decode(input_ids, {"inputs_embeds": embeds}, attention_mask, past_key_values, position_ids)

    def _validate_model_kwargs(self, model_kwargs: dict) -> None:
        """The processor's audio tensors reach `forward` through `**audio`, which transformers' check does not read."""
        audio = {k: model_kwargs.pop(k) for k in self.layout["audio_inputs"] if k in model_kwargs}
        super(ORTModelForImageTextToText, self)._validate_model_kwargs(model_kwargs)
        model_kwargs.update(audio)

    def _expand_inputs_for_generation(self, expand_size=1, is_encoder_decoder=False, input_ids=None, **kwargs):
        return super(ORTModelForImageTextToText, self)._expand_inputs_for_generation(
            expand_size, is_encoder_decoder, input_ids, **kwargs)


__all__ = ["LAYOUT_FILE", "ORTModelForSpeechLM"]
