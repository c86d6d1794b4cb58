"""The export as users run it: the runtime class's `generate` on the prompts the capture ran, against PyTorch's
greedy tokens.

Every graph can match PyTorch call by call while the runtime class that drives it does not: its cache bookkeeping,
its default positions, its first-step cache. So the validation also loads the written directory with the task's
runtime class and runs its `generate` on the captured batches (left-padded rows included); other tokens than
PyTorch's make the export fail like a gross numerical difference (`GrossMismatch`). Exports whose tokens may
legitimately differ (`--dtype fp16`, `--quantize`) are not checked so, nor exports with an explicit `--atol`, whose
bound decides alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch

from ..quiet import without_message
from .gate import GrossMismatch


def check_generate(runtime_class: type, directory: Path, generations: Sequence, use_cache: bool) -> str:
    """Raise GrossMismatch at the first captured batch whose tokens differ; else the line the log shows."""
    model = runtime_class.from_pretrained(directory, use_cache=use_cache)
    for number, generation in enumerate(generations, 1):
        prompt = generation.inputs["input_ids"].shape[1]
        # optimum's runtime builds its outputs with the pre-5.24 name, which transformers 5.24 warns about
        with torch.no_grad(), without_message("transformers.utils.generic", "are deprecated. Use `cache` instead"):
            got = model.generate(**generation.inputs, **generation.options)[:, prompt:]
        want = generation.tokens
        if got.shape != want.shape or not torch.equal(got, want):
            where = (got[:, : want.shape[1]] != want).nonzero() if got.shape == want.shape else None
            at = f" (row {int(where[0, 0])}, new token {int(where[0, 1]) + 1})" if where is not None and len(where) else ""
            raise GrossMismatch(f"{runtime_class.__name__}.generate gives other greedy tokens than PyTorch's on captured "
                                f"batch {number}{at}, although each graph call matched: the export is wrong as run")
    batches = "1 captured batch" if len(generations) == 1 else f"{len(generations)} captured batches"
    return f"{runtime_class.__name__}.generate: PyTorch's greedy tokens on {batches}"
