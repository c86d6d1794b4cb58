"""A decoder LM with its KV cache inside: `forward(input_ids[1, seq], cache_position[seq]) -> logits`.

The cache is a transformers `StaticCache` of `max_seq_len` positions whose tensors are the module's buffers,
so `torch.export` turns them into mutable buffers (ExecuTorch keeps them inside the program). Sliding-window
layers get a full-length layer too: their window is applied by the attention mask (built from the config),
so a prompt longer than the window runs in one call. transformers' own wrapper differs between versions
(4.57 passes `cache_position` to the model; 5.x forward takes none and reads the cache's length), hence
this one, written for both.
"""

from __future__ import annotations

import inspect

import torch


def head_shapes(config) -> tuple[int, int]:
    """(key/value heads, head dim) of a text config."""
    heads = getattr(config, "num_attention_heads")
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return kv_heads, head_dim


def full_length_cache(config, max_seq_len: int, dtype: torch.dtype):
    """A `StaticCache` of `max_seq_len` positions on every layer, allocated now (export needs it)."""
    from transformers.cache_utils import StaticCache, StaticLayer

    cache = StaticCache(config=config, max_cache_len=max_seq_len)
    cache.layers = [StaticLayer(max_seq_len) for _ in cache.layers]
    kv_heads, head_dim = head_shapes(config)
    cache.early_initialization(1, kv_heads, head_dim, dtype, torch.device("cpu"))
    return cache


class StaticCacheLM(torch.nn.Module):
    """`model` (a causal LM) stepped with an internal static cache; batch 1."""

    def __init__(self, model, max_seq_len: int):
        super().__init__()
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.model = model
        self.max_seq_len = max_seq_len
        self.vocab_size = config.vocab_size
        dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
        self.cache = full_length_cache(config, max_seq_len, dtype)
        self.takes_positions = "cache_position" in inspect.signature(model.forward).parameters
        for i, layer in enumerate(self.cache.layers):
            self.register_buffer(f"key_cache_{i}", layer.keys, persistent=False)
            self.register_buffer(f"value_cache_{i}", layer.values, persistent=False)
            if hasattr(layer, "cumulative_length"):  # transformers 5: the cache counts what it holds
                self.register_buffer(f"cumulative_length_{i}", layer.cumulative_length, persistent=False)

    def reset(self) -> None:
        """Empty the cache (a new sequence); the model's own buffers (rotary frequencies) are left alone."""
        for layer in self.cache.layers:
            for tensor in (layer.keys, layer.values, getattr(layer, "cumulative_length", None)):
                if tensor is not None:
                    tensor.zero_()

    def forward(self, input_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        extra = {"cache_position": cache_position} if self.takes_positions else {}
        for layer in self.cache.layers:
            if hasattr(layer, "cumulative_length"):
                layer.cumulative_length.copy_(cache_position[0])
        out = self.model(input_ids=input_ids, attention_mask=None, past_key_values=self.cache, use_cache=True, **extra)
        return out.logits
