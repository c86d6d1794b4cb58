"""A decoder LM with its KV cache inside: `forward(input_ids[1, seq], cache_position[seq]) -> logits`.

The cache is a transformers `StaticCache` whose tensors are the module's buffers, so `torch.export` turns
them into mutable buffers (ExecuTorch keeps them inside the program): `max_seq_len` positions on full-attention
layers, `sliding_window` positions on sliding-window layers (`WindowLayer`: bounded, and a prompt longer than the
window still runs in one call). With sliding layers the wrapper builds the attention masks itself, from
`cache_position` (transformers' sliding static layer decides its branches from a Python counter, which one
exported program cannot do). transformers' own wrapper differs between versions (4.57 passes `cache_position`
to the model; 5.x forward takes none and reads the cache's length), hence this one, written for both.
"""

from __future__ import annotations

import inspect

import torch

from legacy_bridge import cache_argument


def head_shapes(config) -> tuple[int, int]:
    """(key/value heads, head dim) of a text config."""
    heads = getattr(config, "num_attention_heads")
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return kv_heads, head_dim


def window_layer_class():
    from transformers.cache_utils import StaticLayer

    class WindowLayer(StaticLayer):
        """The last `window` positions' keys and values, oldest first. `update` returns them followed by the new
        tokens' (window + new positions: the mask hides those out of each query's window, or before position 0)
        and keeps the last `window`: no branch on how full the layer is."""

        is_sliding = True

        def update(self, key_states, value_states, *args, **kwargs):
            keys = torch.cat([self.keys, key_states], dim=-2)
            values = torch.cat([self.values, value_states], dim=-2)
            self.keys.copy_(keys[:, :, -self.max_cache_len :])
            self.values.copy_(values[:, :, -self.max_cache_len :])
            return keys, values

    return WindowLayer


def bounded_cache(config, max_seq_len: int, dtype: torch.dtype):
    """A `StaticCache` allocated now (export needs it): `max_seq_len` positions on full-attention layers, the
    window on the layers transformers makes sliding (when the window is shorter). Returns (cache, window or None)."""
    from transformers.cache_utils import StaticCache, StaticLayer

    cache = StaticCache(config=config, max_cache_len=max_seq_len)
    window = getattr(config, "sliding_window", None)
    bounded = window is not None and window < max_seq_len
    window_layer = window_layer_class()
    cache.layers = [window_layer(window) if bounded and getattr(layer, "is_sliding", False) else StaticLayer(max_seq_len)
                    for layer in cache.layers]
    kv_heads, head_dim = head_shapes(config)
    cache.early_initialization(1, kv_heads, head_dim, dtype, torch.device("cpu"))
    sliding = any(layer.is_sliding for layer in cache.layers)
    return cache, (window if sliding else None)


def additive(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[query, key] booleans -> the [1, 1, query, key] additive mask attention takes."""
    return torch.zeros(visible.shape, dtype=dtype).masked_fill(~visible, torch.finfo(dtype).min)[None, None]


def window_masks(cache_position: torch.Tensor, max_seq_len: int, window: int, dtype: torch.dtype):
    """(full-attention mask over `max_seq_len` positions, sliding mask over window + new positions) for the new
    tokens at `cache_position`; in the sliding layer key j holds position cache_position[0] - window + j."""
    query = cache_position[:, None]
    full = torch.arange(max_seq_len)[None] <= query
    keys = torch.arange(window + cache_position.shape[0])[None] + (cache_position[0] - window)
    sliding = (keys >= 0) & (keys <= query) & (query - keys < window)
    return additive(full, dtype), additive(sliding, dtype)


class StaticCacheLM(torch.nn.Module):
    """`model` (a causal LM) stepped with an internal static cache; batch 1."""

    def __init__(self, model, max_seq_len: int):
        super().__init__()
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.model = model
        self.max_seq_len = max_seq_len
        self.vocab_size = config.vocab_size
        dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
        self.dtype = dtype
        self.cache, self.window = bounded_cache(config, max_seq_len, dtype)
        self.layer_kinds = {layer.is_sliding for layer in self.cache.layers}
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
        out = self.model(input_ids=input_ids, attention_mask=self.masks(cache_position),
                         **{cache_argument.name(): self.cache},
                         use_cache=True, **extra)
        return out.logits

    def masks(self, cache_position: torch.Tensor):
        """None (the model builds its masks) without sliding layers; else the sliding mask, or both by kind."""
        if self.window is None:
            return None
        full, sliding = window_masks(cache_position, self.max_seq_len, self.window, self.dtype)
        if self.layer_kinds == {True}:
            return sliding
        return {"full_attention": full, "sliding_attention": sliding}
