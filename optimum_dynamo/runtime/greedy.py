"""Greedy decoding over a step function `step(input_ids[1, seq], cache_position[seq]) -> logits[1, seq, vocab]`
whose cache lives inside it: the prompt in one call, then one token per call. Drives the capture of the
ExecuTorch export (a PyTorch wrapper) and the package's `.pte` runner alike."""

from __future__ import annotations

from typing import Callable, Sequence

import torch

Step = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def greedy(step: Step, prompt: Sequence[int], *, max_seq_len: int, max_new_tokens: int | None = None,
           eos_ids: Sequence[int] = ()) -> list[int]:
    """New tokens after `prompt`: stops at an eos token (kept), after `max_new_tokens`, or when prompt and
    new tokens fill `max_seq_len` positions (the cache's size)."""
    prompt = [int(t) for t in prompt]
    if not 0 < len(prompt) < max_seq_len:
        raise ValueError(f"a prompt of {len(prompt)} tokens does not fit max_seq_len={max_seq_len} with one new token")
    logits = step(torch.tensor([prompt], dtype=torch.long), torch.arange(len(prompt), dtype=torch.long))
    new = [int(logits[0, -1].argmax())]
    limit = max_seq_len - len(prompt) if max_new_tokens is None else min(max_new_tokens, max_seq_len - len(prompt))
    while len(new) < limit and new[-1] not in eos_ids:
        position = len(prompt) + len(new) - 1
        logits = step(torch.tensor([[new[-1]]], dtype=torch.long), torch.tensor([position], dtype=torch.long))
        new.append(int(logits[0, -1].argmax()))
    return new
