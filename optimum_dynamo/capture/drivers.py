"""Run a model the way users run it, so the observer sees every kind of call.

Text generation: two `generate` runs of different batch and length, one row left-padded (so the
attention mask is kept). The second reuses the cache of a prompt prefix (prefix caching), which
gives a call where new tokens, past length and batch are all >= 2. State models are stepped one token
per call (`stepping.py`). Encoder-decoder models: two `generate` runs (batch 2 then 3, different encoder
lengths), then a scoring forward with three decoder tokens and no cache, then two more decoder tokens on that
cache: the decoder is seen with and without a cache, one and several new tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from legacy_bridge import cache_argument

from ..errors import PipelineError
from ..flatten import is_cache
from ..quiet import without_message
from .samples import (FORWARD_TEXTS, NEW_TOKENS, PREFIX, encoder_batches, image_size, main_input, optional,
                      pad_and_vocab, text_batches, text_samples, waveform_batches)
from .stepping import is_state_model, step_generate


@dataclass
class Generation:
    """A greedy generation the capture ran: PyTorch's new tokens for `inputs` under `options` (what the export's
    runtime class must give back: `validate.generate`)."""

    inputs: dict[str, torch.Tensor]
    options: dict
    tokens: torch.Tensor


def greedy(new_tokens: int = NEW_TOKENS, pad: int | None = None) -> dict:
    """`generate`'s options for exactly `new_tokens` greedy tokens (and the pad id, where given)."""
    options = dict(do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens)
    return options if pad is None else dict(options, pad_token_id=pad)


@torch.no_grad()
def drive_text_generation(model, tokenizer=None) -> list[Generation]:
    if is_state_model(model):
        return drive_state_generation(model, tokenizer)
    pad, vocab_size = pad_and_vocab(model)
    first, second = text_samples(tokenizer, vocab_size, pad)
    options = greedy(pad=pad)
    inputs = dict(input_ids=first.input_ids, attention_mask=first.attention_mask)
    generations = [Generation(inputs, options, _new_tokens(model.generate(**inputs, **options), first.input_ids))]
    # The prefix cache comes from `generate` too, so it has the cache class generate builds for this model
    # (a plain forward may build another one: gpt_bigcode on transformers 4 makes an EncoderDecoderCache).
    # The left-padded row's prefix is all padding: transformers takes it for right padding and says so, falsely.
    with without_message("transformers.generation.utils", "right-padding was detected"):
        prefix = model.generate(
            input_ids=second.input_ids[:, :PREFIX],
            attention_mask=second.attention_mask[:, :PREFIX],
            return_dict_in_generate=True,
            **dict(options, max_new_tokens=1, min_new_tokens=1),
        )
    cache = cache_argument.of(prefix)
    if cache is not None and not is_cache(cache):  # XLNet's `mems`
        raise PipelineError(f"{model.config.model_type}'s generate carries its past as a {type(cache).__name__} of "
                            "tensors, not a cache: optimum's runtime has no way to feed it back, so it cannot be "
                            "exported for text generation")
    inputs = dict(input_ids=second.input_ids, attention_mask=second.attention_mask)
    out = model.generate(**inputs, **{cache_argument.name(): cache}, **options)
    return [*generations, Generation(inputs, options, _new_tokens(out, second.input_ids))]


def _new_tokens(sequences: torch.Tensor, prompt: torch.Tensor) -> torch.Tensor:
    return sequences[:, prompt.shape[1]:]


@torch.no_grad()
def drive_state_generation(model, tokenizer=None) -> list[Generation]:
    """Two batches (2 and 3 rows, one left-padded), prompt and new tokens one per call. Runs with
    the export patches applied: a patch that changes a cache's update must be seen by capture too."""
    from .. import patches

    pad, vocab_size = pad_and_vocab(model)
    options = greedy(pad=pad)
    generations = []
    with patches.applied():
        for sample in text_samples(tokenizer, vocab_size, pad):
            tokens = step_generate(model, sample.input_ids, sample.attention_mask, NEW_TOKENS)
            inputs = dict(input_ids=sample.input_ids, attention_mask=sample.attention_mask)
            generations.append(Generation(inputs, options, tokens))
    return generations


@torch.no_grad()
def drive_forward(model, preprocessor=None) -> None:
    """A task of one forward (feature extraction, classification, detection, ...) on inputs of the model's
    modality, as transformers names its main input: text, images or audio."""
    main = main_input(model)
    if main == "pixel_values":
        return drive_image_forward(model, preprocessor)
    if main == "input_values":
        for inputs in waveform_batches(model, preprocessor):
            model(**inputs)
        return None
    if main == "input_features":
        for inputs in encoder_batches(model, processor=preprocessor, mask=True):  # as the task's pipeline calls it
            model(**inputs)
        return None
    return drive_text_forward(model, preprocessor)


@torch.no_grad()
def drive_text_forward(model, tokenizer=None) -> None:
    """Feature extraction, fill-mask, text/token classification, question answering."""
    for inputs in text_batches(model, tokenizer, FORWARD_TEXTS):
        model(**inputs)


@torch.no_grad()
def drive_text_and_images(model, tokenizer=None) -> None:
    """Zero-shot image classification (CLIP-style dual encoders): label texts and images, their counts varied
    apart (2 texts x 3 images, then 3 x 2), random pixels at the vision config's size."""
    vision = getattr(model.config, "vision_config", model.config)
    channels, size = optional(vision, "num_channels", 3), image_size(vision)
    g = torch.Generator().manual_seed(0)
    for texts, images in zip(text_batches(model, tokenizer, FORWARD_TEXTS), (3, 2)):
        model(**texts, pixel_values=torch.randn(images, channels, size, size, generator=g))


@torch.no_grad()
def drive_multiple_choice(model, tokenizer=None) -> None:
    """[batch, choices, sequence] inputs: batch 2 x 2 choices, then 3 x 3, different lengths."""
    for batch, texts in ((2, FORWARD_TEXTS[0] * 2), (3, FORWARD_TEXTS[1] * 3)):
        (inputs,) = text_batches(model, tokenizer, [texts])
        model(**{k: v.reshape(batch, len(texts) // batch, -1) for k, v in inputs.items()})


@torch.no_grad()
def drive_image_forward(model, processor=None) -> None:
    """Image tasks: batches 2 and 3 at the configured image size, then 3 at a second size when the model accepts
    one (the export's sample; `size_guards` goes back to the first size when the model branches on it). With the
    checkpoint's image processor, random images of two sizes go through it (it resizes them)."""
    if processor is not None and hasattr(processor, "preprocess"):
        import numpy as np

        rng = np.random.default_rng(0)
        for batch, (height, width) in ((2, (40, 48)), (3, (56, 64))):
            images = [rng.integers(0, 256, (height, width, 3), dtype=np.uint8) for _ in range(batch)]
            model(pixel_values=processor(images=images, return_tensors="pt")["pixel_values"])
        return
    config = model.config
    channels, size = getattr(config, "num_channels", 3), image_size(config)
    g = torch.Generator().manual_seed(0)
    for batch in (2, 3):
        model(pixel_values=torch.randn(batch, channels, size, size, generator=g))
    for other in (size + 16, size + 32):  # + 32: backbones that take multiples of their stride (GLPN, PP-OCR)
        try:  # fixed-size models (ViT) take neither: the batch alone varies
            model(pixel_values=torch.randn(3, channels, other, other, generator=g))
            return
        except Exception:
            continue


@torch.no_grad()
def drive_seq2seq_generation(model, tokenizer=None, processor=None, batches=None) -> None:
    """`batches`: two batches of encoder inputs (else made for the model's modality: `encoder_batches`)."""
    batches = batches or encoder_batches(model, tokenizer, processor, mask=True)  # the ASR pipeline's mask too
    generation = model.generation_config
    options = greedy(pad=optional(model.config, "pad_token_id", 0) if generation.pad_token_id is None else None)
    for batch in batches:
        generated = cache_argument.of(model.generate(**batch, **options, return_dict_in_generate=True))
    batch = batches[-1]
    rows = next(iter(batch.values())).shape[0]
    start = generation.decoder_start_token_id
    start = start[0] if isinstance(start, list) else start
    tokens = torch.randint(3, 16, (rows, 5), generator=torch.Generator().manual_seed(0))
    tokens[:, 0] = start if start is not None else 0
    # the encoder first, as generate does (transformers 5's switch_transformers passes use_cache on to its encoder);
    # its own output class, whose fields transformers 5 reads by name
    encoded = model.get_encoder()(**batch)
    masks = {k: v for k, v in batch.items() if k == "attention_mask"}
    scored = model(**masks, encoder_outputs=encoded, decoder_input_ids=tokens[:, :3], use_cache=True)
    cache = cache_argument.of(scored)
    if is_cache(generated) and type(cache) is not type(generated):
        # a plain forward made another cache than generate's (transformers 4.55's VisionEncoderDecoder: no
        # cross-attention part): the prefix cache comes from generate, the way the runtime will hold it
        cache = cache_argument.of(model.generate(**batch, decoder_input_ids=tokens[:, :3], return_dict_in_generate=True,
                                                 **dict(options, max_new_tokens=1, min_new_tokens=1)))
    model(**masks, encoder_outputs=encoded, decoder_input_ids=tokens[:, 3:],
          **{cache_argument.name(): cache}, use_cache=True)
