"""The prompts a vision-language export observes: the processor's image placeholder in a short prompt, the
processor's tensors that the model's forward takes, and prompts without an image where the model takes them."""

from __future__ import annotations

import inspect

import torch


def image_token(processor) -> str | None:
    """The processor's image token: its `image_token`, else the token of its `image_token_id` (Idefics)."""
    token = getattr(processor, "image_token", None)
    if token is None and isinstance(getattr(processor, "image_token_id", None), int):
        token = processor.tokenizer.convert_ids_to_tokens(processor.image_token_id)
    return token


def image_placeholder(processor, config=None) -> str:
    """The processor's image placeholder (Gemma3: `boi_token`, LLaVA: `image_token`), between the vision start
    and end tokens where the config has them (Qwen2-VL: transformers 4 finds images by their start token)."""
    placeholder = getattr(processor, "boi_token", None) or image_token(processor)
    start, end = (getattr(config, f"vision_{edge}_token_id", None) for edge in ("start", "end"))
    if start is not None and end is not None:
        start, end = processor.tokenizer.convert_ids_to_tokens([start, end])
        placeholder = f"{start}{placeholder}{end}"
    return placeholder


def default_prompt(processor, config=None) -> str:
    """A short prompt with the processor's image placeholder."""
    return f"the quick {image_placeholder(processor, config)} brown fox"


def processor_inputs(model, processor, image, prompt, **options) -> dict:
    """The processor's tensors that `model.forward` takes (tokenizers may add token types it does not);
    `options` go to the processor (`padding=True` for a batch of prompts)."""
    params = inspect.signature(model.forward).parameters
    batch = processor(images=image, text=prompt, return_tensors="pt", **options)
    return {k: v for k, v in batch.items() if k in params}


def text_batches(model, processor) -> list[dict]:
    """Prompts without an image (one, then two left-padded); none when the model's processor or its own `generate`
    refuses such a prompt (Kosmos-2), or when the processor gives the model pixels anyway (Idefics: the graphs of
    prompts with an image take it)."""
    tokenizer = getattr(processor, "tokenizer", processor)
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    try:
        prompts = ["the quick brown fox", "a longer prompt: the quick brown fox jumps over the lazy dog"]
        batches = [processor_inputs(model, processor, None, prompts[:1]),
                   processor_inputs(model, processor, None, prompts, padding=True)]
        if "pixel_values" in batches[1]:
            return []
        with torch.no_grad():
            model.generate(**batches[1], max_new_tokens=1, do_sample=False)
    except (TypeError, ValueError, RuntimeError, IndexError, AttributeError):  # the model's refusal, not ours
        return []
    finally:
        tokenizer.padding_side = side
    return batches


__all__ = ["default_prompt", "image_placeholder", "image_token", "processor_inputs", "text_batches"]
