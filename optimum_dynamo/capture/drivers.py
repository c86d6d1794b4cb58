"""Run a model the way users run it, so the observer sees every kind of call.

Text generation: two `generate` runs of different batch and length, one row left-padded (so the
attention mask is kept). The second reuses the cache of a prompt prefix (prefix caching), which
gives a call where new tokens, past length and batch are all >= 2.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..quiet import without_message

_TEXTS = [
    ["hello world", "the quick brown fox jumps over the lazy dog"],
    ["a tiny model speaks", "optimum exports models to onnx for fast inference", "hello world from the exporter"],
]
_PREFIX = 2  # prompt tokens whose cache the second run reuses
_NEW_TOKENS = 3


@dataclass
class Sample:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor


def _random_sample(batch: int, length: int, vocab: int, pad: int, seed: int) -> Sample:
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
                             if k in ("input_ids", "attention_mask")}) for t in _TEXTS]
        lengths = [s.input_ids.shape[1] for s in samples]
        padded = all((s.attention_mask == 0).any() for s in samples)
        if padded and lengths[0] >= 2 and lengths[1] >= _PREFIX + 2 and lengths[0] != lengths[1] and (
            max(int(s.input_ids.max()) for s in samples) < vocab_size
        ):
            return samples
    return [_random_sample(2, 5, vocab_size, pad_token_id, 0), _random_sample(3, 8, vocab_size, pad_token_id, 1)]


def optional(config, name: str, default=None):
    """An optional config field: transformers 5 configs no longer define every field on every class
    (codegen has no `pad_token_id` attribute when it is unset)."""
    value = getattr(config, name, None)
    return default if value is None else value


def _pad_and_vocab(model) -> tuple[int, int]:
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    pad = optional(model.generation_config, "pad_token_id", optional(config, "pad_token_id", 0))
    return (pad[0] if isinstance(pad, list) else pad), config.vocab_size


@torch.no_grad()
def drive_text_generation(model, tokenizer=None) -> None:
    if is_state_model(model):
        return drive_state_generation(model, tokenizer)
    pad, vocab_size = _pad_and_vocab(model)
    first, second = text_samples(tokenizer, vocab_size, pad)
    options = dict(do_sample=False, max_new_tokens=_NEW_TOKENS, min_new_tokens=_NEW_TOKENS, pad_token_id=pad)
    model.generate(input_ids=first.input_ids, attention_mask=first.attention_mask, **options)
    # The prefix cache comes from `generate` too, so it has the cache class generate builds for this model
    # (a plain forward may build another one: gpt_bigcode on transformers 4 makes an EncoderDecoderCache).
    # The left-padded row's prefix is all padding: transformers takes it for right padding and says so, falsely.
    with without_message("transformers.generation.utils", "right-padding was detected"):
        prefix = model.generate(
            input_ids=second.input_ids[:, :_PREFIX],
            attention_mask=second.attention_mask[:, :_PREFIX],
            return_dict_in_generate=True,
            **dict(options, max_new_tokens=1, min_new_tokens=1),
        )
    model.generate(
        input_ids=second.input_ids,
        attention_mask=second.attention_mask,
        past_key_values=prefix.past_key_values,
        **options,
    )


# ── State models (Mamba): one token per call ──
# A state has no sequence axis, and Mamba's multi-token path ignores a given state: the exported graph
# advances the state by one token, from a zero state. The driver runs the model exactly so (the prompt
# token by token, its attention-mask column with it, then greedy tokens); `optimum_dynamo.runtime`
# drives the exported graph the same way.


def cache_kwarg(model) -> str:
    """The forward kwarg that carries the cache: `cache_params` (Mamba) or `past_key_values`."""
    params = _forward_params(model)
    return "cache_params" if "cache_params" in params and "past_key_values" not in params else "past_key_values"


def _own_state_cache(model):
    """transformers 4 hybrids (Jamba, Zamba): the registered state cache class defined beside the model."""
    from ..flatten import registry

    module = type(model).__module__
    return next((k.resolve() for k in registry.kinds() if k.path.rpartition(".")[0] == module and k.resolve()), None)


def is_state_model(model) -> bool:
    """Models driven one token at a time: Mamba-style models (their cache is `cache_params`), models
    with their own state cache class (transformers 4 hybrids), and models whose transformers >= 5
    cache has linear-attention (state) layers."""
    if cache_kwarg(model) == "cache_params" or _own_state_cache(model) is not None:
        return True
    from ..flatten.states import is_state_layer

    try:
        from transformers import DynamicCache

        layers = DynamicCache(config=model.config).layers
    except Exception:  # transformers 4: no cache built from a config
        return False
    return any(is_state_layer(layer) for layer in layers)


def zero_state(model, batch: int):
    """The model's cache for `batch` rows before the first token: every state zero, keys/values of
    length 0. Made by a forward called directly (`model.forward`), so observers, which hook
    `model(...)`, do not record it."""
    from ..flatten import flatten_cache, unflatten_cache

    ids = torch.zeros(batch, 1, dtype=torch.long)
    cache = getattr(model.forward(input_ids=ids, use_cache=True), cache_kwarg(model))
    own = _own_state_cache(model)
    if cache is None and own is not None:  # transformers 4 Jamba/Zamba return no cache unless given one
        cache = model.forward(input_ids=ids, use_cache=True, past_key_values=own(model.config, batch, dtype=model.dtype)).past_key_values
    names, tensors, context = flatten_cache(cache)
    empty = [t[..., :0, :] if n.endswith((".key", ".value")) else torch.zeros_like(t) for n, t in zip(names, tensors)]
    return unflatten_cache(type(cache), context, empty)


def _full_mask(cache) -> bool:
    """Whether the cache has attention layers: they take the whole mask, state layers its last column."""
    from ..flatten import flatten_cache

    return any(n.endswith(".key") for n in flatten_cache(cache)[0])


@torch.no_grad()
def step_generate(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy generation one token per call from a zero state; returns the generated tokens."""
    kwarg, params = cache_kwarg(model), _forward_params(model)
    batch, length = input_ids.shape
    cache, tokens = zero_state(model, batch), []
    ids, mask, first = input_ids, attention_mask, 0 if _full_mask(cache) else None
    for t in range(length + new_tokens - 1):
        step_mask = mask[:, first if first is not None else t : t + 1]
        inputs = {"input_ids": ids[:, t : t + 1], "attention_mask": step_mask, kwarg: cache, "use_cache": True}
        if "cache_position" in params:  # transformers 4 Mamba requires it, Jamba needs it past the first step
            inputs["cache_position"] = torch.tensor([t])
        out = model(**inputs)
        cache = getattr(out, kwarg)
        if t >= length - 1:
            tokens.append(out.logits[:, -1].argmax(-1))
            ids = torch.cat([ids, tokens[-1][:, None]], dim=1)
            mask = torch.cat([mask, torch.ones(batch, 1, dtype=mask.dtype)], dim=1)
    return torch.stack(tokens, dim=1)


@torch.no_grad()
def drive_state_generation(model, tokenizer=None) -> None:
    """Two batches (2 and 3 rows, one left-padded), prompt and new tokens one per call. Runs with
    the export patches applied: a patch that changes a cache's update must be seen by capture too."""
    from .. import patches

    pad, vocab_size = _pad_and_vocab(model)
    with patches.applied():
        for sample in text_samples(tokenizer, vocab_size, pad):
            step_generate(model, sample.input_ids, sample.attention_mask, _NEW_TOKENS)


_FORWARD_TEXTS = [
    ["hello world", "the quick brown fox jumps"],
    ["a tiny model speaks in random words today", "optimum exports models", "hello world from the exporter"],
]


def _forward_params(model) -> set[str]:
    import inspect

    return set(inspect.signature(model.forward).parameters)


def _text_batches(model, tokenizer, texts: list[list[str]]) -> list[dict[str, torch.Tensor]]:
    """Tokenized batches (padded), or random ids of two lengths; only inputs the model takes."""
    params = _forward_params(model)
    vocab = model.config.vocab_size
    if tokenizer is not None:
        batches = [dict(tokenizer(t, return_tensors="pt", padding=True)) for t in texts]
        if all(int(b["input_ids"].max()) < vocab for b in batches):
            return [{k: v for k, v in b.items() if k in params} for b in batches]
    batches = []
    for seed, (batch, length) in enumerate([(2, 6), (3, 11)]):
        sample = _random_sample(batch, length, vocab, optional(model.config, "pad_token_id", 0), seed)
        inputs = {"input_ids": sample.input_ids, "attention_mask": sample.attention_mask}
        if "token_type_ids" in params:
            inputs["token_type_ids"] = torch.zeros_like(sample.input_ids)
        batches.append(inputs)
    return batches


@torch.no_grad()
def drive_text_forward(model, tokenizer=None) -> None:
    """Feature extraction, fill-mask, text/token classification, question answering."""
    for inputs in _text_batches(model, tokenizer, _FORWARD_TEXTS):
        model(**inputs)


@torch.no_grad()
def drive_multiple_choice(model, tokenizer=None) -> None:
    """[batch, choices, sequence] inputs: batch 2 x 2 choices, then 3 x 3, different lengths."""
    for batch, texts in ((2, _FORWARD_TEXTS[0] * 2), (3, _FORWARD_TEXTS[1] * 3)):
        (inputs,) = _text_batches(model, tokenizer, [texts])
        model(**{k: v.reshape(batch, len(texts) // batch, -1) for k, v in inputs.items()})


def _image_size(config) -> int:
    size = getattr(config, "image_size", None) or 64
    return size[0] if isinstance(size, (list, tuple)) else size


@torch.no_grad()
def drive_image_forward(model, processor=None) -> None:
    """Image tasks: batch 2 then 3, and a second image size when the model accepts one. With the
    checkpoint's image processor, random images of two sizes go through it (it resizes them)."""
    if processor is not None and hasattr(processor, "preprocess"):
        import numpy as np

        rng = np.random.default_rng(0)
        for batch, (height, width) in ((2, (40, 48)), (3, (56, 64))):
            images = [rng.integers(0, 256, (height, width, 3), dtype=np.uint8) for _ in range(batch)]
            model(pixel_values=processor(images=images, return_tensors="pt")["pixel_values"])
        return
    config = model.config
    channels, size = getattr(config, "num_channels", 3), _image_size(config)
    g = torch.Generator().manual_seed(0)
    model(pixel_values=torch.randn(2, channels, size, size, generator=g))
    try:
        model(pixel_values=torch.randn(3, channels, size + 16, size + 16, generator=g))
    except Exception:  # fixed-size models (e.g. ViT without interpolation): vary the batch only
        model(pixel_values=torch.randn(3, channels, size, size, generator=g))


# ── Encoder-decoder models (seq2seq, speech, vision) ──
# Two `generate` runs (batch 2 then 3, different encoder lengths), then a scoring forward with three
# decoder tokens and no cache, then two more decoder tokens on that cache: so the decoder is seen with and
# without a cache, one and several new tokens.


def _speech_batches(model, processor) -> list[dict[str, torch.Tensor]]:
    """Synthesized waveforms (tones + noise) through the checkpoint's feature extractor; without one,
    log-mel-like features shaped as the model takes them (its mel bins, 2 x max_source_positions frames)."""
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
        features = processor(waves, sampling_rate=rate, return_tensors="pt")
        batches.append({"input_features": features["input_features"]})
    return batches


def _image_batches(model, processor) -> list[dict[str, torch.Tensor]]:
    import numpy as np

    if processor is None:  # pixel values at the encoder's image size
        config = getattr(model.config, "encoder", model.config)
        channels, size = optional(config, "num_channels", 3), _image_size(config)
        g = torch.Generator().manual_seed(0)
        return [{"pixel_values": torch.randn(batch, channels, size, size, generator=g)} for batch in (2, 3)]

    rng = np.random.default_rng(0)
    batches = []
    for batch, (height, width) in ((2, (40, 48)), (3, (56, 64))):
        images = [rng.integers(0, 256, (height, width, 3), dtype=np.uint8) for _ in range(batch)]
        batches.append({"pixel_values": processor(images=images, return_tensors="pt")["pixel_values"]})
    return batches


def encoder_batches(model, tokenizer=None, processor=None) -> list[dict[str, torch.Tensor]]:
    """Two batches of encoder inputs of the model's modality (text rows are left-padded)."""
    main = getattr(model, "main_input_name", "input_ids")
    if main == "input_features":
        return _speech_batches(model, processor)
    if main == "pixel_values":
        return _image_batches(model, processor)
    config = model.config
    pad = optional(config, "pad_token_id", 0)
    return [{"input_ids": s.input_ids, "attention_mask": s.attention_mask}
            for s in text_samples(tokenizer, config.vocab_size, pad)]


@torch.no_grad()
def drive_seq2seq_generation(model, tokenizer=None, processor=None) -> None:
    batches = encoder_batches(model, tokenizer, processor)
    generation = model.generation_config
    options = dict(do_sample=False, max_new_tokens=_NEW_TOKENS, min_new_tokens=_NEW_TOKENS)
    if generation.pad_token_id is None:
        options["pad_token_id"] = optional(model.config, "pad_token_id", 0)
    for batch in batches:
        model.generate(**batch, **options)
    batch = batches[-1]
    rows = next(iter(batch.values())).shape[0]
    start = generation.decoder_start_token_id
    start = start[0] if isinstance(start, list) else start
    tokens = torch.randint(3, 16, (rows, 5), generator=torch.Generator().manual_seed(0))
    tokens[:, 0] = start if start is not None else 0
    scored = model(**batch, decoder_input_ids=tokens[:, :3], use_cache=True)
    masks = {k: v for k, v in batch.items() if k == "attention_mask"}
    model(**masks, encoder_outputs=(scored.encoder_last_hidden_state,), decoder_input_ids=tokens[:, 3:],
          past_key_values=scored.past_key_values, use_cache=True)
