"""Samples the drivers run a model on: tokenized or random text batches (one row left-padded), images,
speech features, encoder inputs of a model's modality."""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

TEXTS = [
    ["hello world", "the quick brown fox jumps over the lazy dog"],
    ["a tiny model speaks", "optimum exports models to onnx for fast inference", "hello world from the exporter"],
]


PREFIX = 2  # prompt tokens whose cache the second run reuses


NEW_TOKENS = 3


@dataclass
class Sample:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor


def random_sample(batch: int, length: int, vocab: int, pad: int, seed: int) -> Sample:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    ids[batch - 1, : length // 2], mask[batch - 1, : length // 2] = pad, 0  # one left-padded row
    return Sample(ids, mask)


def text_samples(tokenizer, vocab_size: int, pad_token_id: int) -> list[Sample]:
    """Two batches (2 x short, 3 x longer), each with a left-padded row; random ids without a tokenizer."""
    if tokenizer is not None:
        tokenizer.padding_side = "left"
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
        samples = [Sample(**{k: v for k, v in tokenizer(t, return_tensors="pt", padding=True).items()
                             if k in ("input_ids", "attention_mask")}) for t in TEXTS]
        lengths = [s.input_ids.shape[1] for s in samples]
        padded = all((s.attention_mask == 0).any() for s in samples)
        if padded and lengths[0] >= 2 and lengths[1] >= PREFIX + 2 and lengths[0] != lengths[1] and (
            max(int(s.input_ids.max()) for s in samples) < vocab_size
        ):
            return samples
    return [random_sample(2, 5, vocab_size, pad_token_id, 0), random_sample(3, 8, vocab_size, pad_token_id, 1)]


def optional(config, name: str, default=None):
    """An optional config field: transformers 5 configs no longer define every field on every class
    (codegen has no `pad_token_id` attribute when it is unset)."""
    value = getattr(config, name, None)
    return default if value is None else value


def pad_and_vocab(model) -> tuple[int, int]:
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    pad = optional(model.generation_config, "pad_token_id", optional(config, "pad_token_id", 0))
    return (pad[0] if isinstance(pad, list) else pad), config.vocab_size


FORWARD_TEXTS = [
    ["hello world", "the quick brown fox jumps"],
    ["a tiny model speaks in random words today", "optimum exports models", "hello world from the exporter"],
]


def forward_params(model) -> set[str]:
    return set(inspect.signature(model.forward).parameters)


def mask_through_kwargs(forward: dict[str, inspect.Parameter]) -> bool:
    """A forward (its signature's parameters) that takes `attention_mask` only through `**kwargs` (OmniASR's, for
    its language model; pipelines give it the tokenizer's all the same)."""
    return "attention_mask" not in forward and any(p.kind is inspect.Parameter.VAR_KEYWORD for p in forward.values())


def vocab_size(config) -> int:
    """The size of the text vocabulary: the text config's (multimodal models, dual encoders like CLIP, T5Gemma 2's
    encoder), FSMT's source vocabulary, or code points below 256 for a character model (CANINE: none named)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return getattr(text, "vocab_size", None) or getattr(config, "src_vocab_size", None) or 256


def text_batches(model, tokenizer, texts: list[list[str]]) -> list[dict[str, torch.Tensor]]:
    """Tokenized batches (padded), or random ids of two lengths where the tokenizer's ids do not fit the vocabulary
    or are empty (transformers 5's Qwen2Tokenizer over a tokenizer.json it does not rebuild); only inputs the model
    takes."""
    params = forward_params(model)
    text = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    vocab = vocab_size(model.config)
    if tokenizer is not None:
        batches = [dict(tokenizer(t, return_tensors="pt", padding=True)) for t in texts]
        if all(b["input_ids"].numel() and int(b["input_ids"].max()) < vocab for b in batches):
            params |= _read_through_kwargs(model, batches[0])
            return [{k: v for k, v in b.items() if k in params} for b in batches]
    batches = []
    for seed, (batch, length) in enumerate([(2, 6), (3, 11)]):
        sample = random_sample(batch, length, vocab, optional(text, "pad_token_id", 0), seed)
        batches.append({"input_ids": sample.input_ids, "attention_mask": sample.attention_mask})
    if "attention_mask" not in params and not _read_through_kwargs(model, batches[0]):
        batches = [{"input_ids": b["input_ids"]} for b in batches]
    # token types of zeros, unless the model computes other ones when given none (then the graph does too)
    if "token_type_ids" in params and zeros_are_default(model, dict(batches[0]), "token_type_ids"):
        for inputs in batches:
            inputs["token_type_ids"] = torch.zeros_like(inputs["input_ids"])
    return batches


@torch.no_grad()
def zeros_are_default(model, inputs: dict[str, torch.Tensor], name: str) -> bool:
    """Whether the model computes the same without `name` as with zeros for it (what optimum's runtime classes feed
    when a user gives none). Not so for BigBird's question answering: its token types come from the question's
    length. Called as `model.forward`, unseen by the capture's observers."""
    without = {k: v for k, v in inputs.items() if k != name}
    try:
        return _same(model, without, dict(without, **{name: torch.zeros_like(inputs["input_ids"])}))
    except Exception:  # a model that cannot run without them: the runtime always gives them
        return True


def _read_through_kwargs(model, batch: dict[str, torch.Tensor]) -> set[str]:
    """{"attention_mask"} if the forward takes it only through `**kwargs` (OmniASR's, for its language model) and
    computes otherwise without it on `batch` (padded); else nothing (FNet mixes tokens without one)."""
    if "attention_mask" not in batch or not mask_through_kwargs(inspect.signature(model.forward).parameters):
        return set()
    without = {k: v for k, v in batch.items() if k != "attention_mask"}
    try:
        return set() if _same(model, without, batch) else {"attention_mask"}
    except Exception:  # it cannot run without it
        return {"attention_mask"}


@torch.no_grad()
def _same(model, a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    """The model's floating outputs on `a` and `b` agree (as `model.forward`: unseen by the capture's observers)."""
    x, y = model.forward(**a), model.forward(**b)
    pairs = [(u, v) for u, v in zip(x.values(), y.values()) if isinstance(u, torch.Tensor) and u.is_floating_point()]
    return all(torch.allclose(u, v, atol=1e-5, rtol=1e-4) for u, v in pairs)


def image_size(config) -> int:
    size = getattr(config, "image_size", None) or 64
    return size[0] if isinstance(size, (list, tuple)) else size


def _speech_batches(model, processor, mask: bool = False) -> list[dict[str, torch.Tensor]]:
    """Synthesized waveforms (tones + noise) through the checkpoint's feature extractor (`mask`: one row shorter,
    with the attention mask the extractor gives, where the model takes one); without one, log-mel-like features
    shaped as the model takes them (its mel bins, 2 x max_source_positions frames)."""
    import numpy as np

    if processor is None:
        from ..errors import ExportError

        bins, positions = optional(model.config, "num_mel_bins"), optional(model.config, "max_source_positions")
        if bins is None or positions is None:
            raise ExportError(f"{model.config.model_type}: the checkpoint has no feature extractor and the config gives "
                              "no num_mel_bins/max_source_positions to synthesize speech features from")
        g = torch.Generator().manual_seed(0)
        return [{"input_features": torch.randn(batch, bins, 2 * positions, generator=g).clamp(-1, 1)} for batch in (2, 3)]

    rate = getattr(processor, "sampling_rate", 16000)
    rng = np.random.default_rng(0)
    batches = []
    for batch, seconds in ((2, 0.5), (3, 0.8)):
        t = np.arange(int(rate * seconds)) / rate
        waves = [(0.3 * np.sin(2 * np.pi * (220 + 110 * i) * t) + 0.01 * rng.standard_normal(t.size)).astype(np.float32)
                 for i in range(batch)]
        if mask:  # one row shorter: padded, as a pipeline's batch is
            waves[-1] = waves[-1][: t.size * 3 // 4]
        try:  # the extractor's own padding (whisper's: to 30 s)
            features = processor(waves, sampling_rate=rate, return_tensors="pt")
        except ValueError:  # one that pads nothing unless asked
            features = processor(waves, sampling_rate=rate, return_tensors="pt", padding=True)
        batch = {"input_features": features["input_features"]}
        if mask and "attention_mask" in features and "attention_mask" in forward_params(model):
            batch["attention_mask"] = features["attention_mask"]
        batches.append(batch)
    return batches


def waveform_batches(model, processor) -> list[dict[str, torch.Tensor]]:
    """Raw-waveform models (wav2vec2, HuBERT, ...: `input_values`): tones + noise of two lengths (2 x 0.5 s, 3 x
    0.8 s, one row shorter), through the checkpoint's feature extractor, else transformers' default one for raw
    waveforms (normalized, zero-padded, no mask: what wav2vec2-base's gives)."""
    import numpy as np

    if processor is None:
        from transformers import Wav2Vec2FeatureExtractor

        processor = Wav2Vec2FeatureExtractor()
    rate = processor.sampling_rate
    rng = np.random.default_rng(0)
    params = forward_params(model)
    batches = []
    for batch, seconds in ((2, 0.5), (3, 0.8)):
        lengths = [int(rate * seconds) - (i == batch - 1) * int(rate * seconds / 4) for i in range(batch)]
        waves = [(0.3 * np.sin(2 * np.pi * (220 + 110 * i) * np.arange(n) / rate)
                  + 0.01 * rng.standard_normal(n)).astype(np.float32) for i, n in enumerate(lengths)]
        features = processor(waves, sampling_rate=rate, return_tensors="pt", padding=True)
        batches.append({k: v for k, v in features.items() if k in params})
    return batches


def _image_batches(model, processor) -> list[dict[str, torch.Tensor]]:
    import numpy as np

    if processor is None:  # pixel values at the encoder's image size
        config = getattr(model.config, "encoder", model.config)
        channels, size = optional(config, "num_channels", 3), image_size(config)
        g = torch.Generator().manual_seed(0)
        return [{"pixel_values": torch.randn(batch, channels, size, size, generator=g)} for batch in (2, 3)]

    rng = np.random.default_rng(0)
    batches = []
    for batch, (height, width) in ((2, (40, 48)), (3, (56, 64))):
        images = [rng.integers(0, 256, (height, width, 3), dtype=np.uint8) for _ in range(batch)]
        batches.append({"pixel_values": processor(images=images, return_tensors="pt")["pixel_values"]})
    return batches


_MAIN_INPUTS = ("input_ids", "pixel_values", "input_values", "input_features")


def main_input(model) -> str:
    """The input that carries the model's modality: transformers' `main_input_name`, unless its forward does not
    take it (a vision tower that inherits the default `input_ids`: Idefics3's, Granite Docling's), then the first
    modality input its forward takes."""
    main = getattr(model, "main_input_name", "input_ids")
    params = inspect.signature(model.forward).parameters
    return main if main in params else next((name for name in params if name in _MAIN_INPUTS), main)


def encoder_batches(model, tokenizer=None, processor=None, mask: bool = False) -> list[dict[str, torch.Tensor]]:
    """Two batches of encoder inputs of the model's modality (text rows are left-padded; `mask`: speech features
    with the mask their extractor gives; raw waveforms as `waveform_batches`)."""
    main = main_input(model)
    if main == "input_features":
        return _speech_batches(model, processor, mask)
    if main == "input_values":
        return waveform_batches(model, processor)
    if main == "pixel_values":
        return _image_batches(model, processor)
    # EncoderDecoderModel: its encoder's own config has the vocabulary (FSMT's encoder has no config of its own)
    encoder = getattr(model.get_encoder(), "config", model.config)
    pad = optional(model.config, "pad_token_id", optional(encoder, "pad_token_id", 0))
    return [{"input_ids": s.input_ids, "attention_mask": s.attention_mask}
            for s in text_samples(tokenizer, vocab_size(encoder), pad)]
