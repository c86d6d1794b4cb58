"""A greedy runner for `.pte` exports, for environments where optimum-executorch cannot be imported
(transformers 4.x). It reads the program's metadata methods like ExecuTorch's LLM runner does:

    model = PteCausalLM(OUT)
    new_tokens = model.generate(prompt_ids, max_new_tokens=12)
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch

from .greedy import greedy

PTE_FILE = "model.pte"


class PteCausalLM:
    def __init__(self, directory: str | Path, file_name: str = PTE_FILE):
        from executorch.runtime import Runtime

        self.program = Runtime.get().load_program(str(Path(directory) / file_name))
        self.forward_method = self.program.load_method("forward")
        self.max_seq_len = int(self.constant("get_max_seq_len"))
        self.eos_ids = [int(t) for t in self.constant("get_eos_ids", all_values=True) or []]

    def constant(self, name: str, all_values: bool = False):
        """A metadata method's value (None when the program has no such method)."""
        if name not in self.program.method_names:
            return None
        values = self.program.load_method(name).execute([])
        return list(values) if all_values else values[0]

    def forward(self, input_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        return self.forward_method.execute([input_ids, cache_position])[0]

    def generate(self, prompt: Sequence[int], max_new_tokens: int | None = None) -> list[int]:
        """New tokens, greedy: the prompt in one call, then one token per call; stops at an eos token or
        when prompt and new tokens fill the program's `get_max_seq_len` positions."""
        return greedy(self.forward, prompt, max_seq_len=self.max_seq_len, max_new_tokens=max_new_tokens,
                      eos_ids=self.eos_ids)
