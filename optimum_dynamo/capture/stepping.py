"""State models (Mamba, hybrids): one token per call.

A state has no sequence axis, and Mamba's multi-token path ignores a given state: the exported graph
advances the state by one token, from a zero state. The driver runs the model exactly so (the prompt
token by token, its attention-mask column with it, then greedy tokens); `optimum_dynamo.runtime`
drives the exported graph the same way.
"""

from __future__ import annotations

import torch

from legacy_bridge import cache_argument

from .samples import forward_params


def cache_kwarg(model) -> str:
    """The forward kwarg that carries the cache: `cache` (transformers 5.24+), `past_key_values`, `cache_params`
    (Mamba before 5.24) or `state` (RWKV)."""
    return cache_argument.parameter(forward_params(model)) or cache_argument.name()


def own_state_cache(model):
    """transformers 4 hybrids (Jamba, Zamba): the registered state cache class defined beside the model."""
    from ..flatten import registry

    module = type(model).__module__
    return next((k.resolve() for k in registry.kinds() if k.path.rpartition(".")[0] == module and k.resolve()), None)


def is_state_model(model) -> bool:
    """Models driven one token at a time: Mamba-style models (their cache is `cache_params`), RWKV (its
    `state`), models with their own state cache class (transformers 4 hybrids), and models whose
    transformers >= 5 cache has linear-attention (state) layers."""
    if cache_kwarg(model) in ("cache_params", "state") or own_state_cache(model) is not None:
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
    `model(...)`, do not record it, on one row and widened to `batch` (the forward's cost is a prompt's: the
    chunked scan of transformers < 5.15's Mamba-2 mixers takes 8 GiB per row at Falcon-H1's sizes)."""
    from ..flatten import flatten_cache, unflatten_cache
    from ..flatten.states import StateList

    ids = torch.zeros(1, 1, dtype=torch.long)
    cache = cache_argument.of(model.forward(input_ids=ids, use_cache=True))
    if type(cache) is list:  # a plain list of state tensors (RWKV): the list with a flattening
        cache = StateList(cache)
    own = own_state_cache(model)
    if cache is None and own is not None:  # transformers 4 Jamba/Zamba return no cache unless given one
        cache = cache_argument.of(model.forward(input_ids=ids, use_cache=True,
                                                **{cache_kwarg(model): _new_cache(own, model, 1)}))
    names, tensors, context = flatten_cache(cache)
    empty = [t.new_zeros((batch, *t.shape[1:-2], 0, t.shape[-1]) if n.endswith((".key", ".value"))
                         else (batch, *t.shape[1:])) for n, t in zip(names, tensors)]
    return unflatten_cache(type(cache), context, empty)


def _new_cache(cls, model, batch: int):
    """A transformers 4 hybrid cache for `batch` rows; Falcon-H1's takes one device per layer."""
    import inspect

    params = inspect.signature(cls.__init__).parameters
    extra = {"devices": [model.device] * model.config.num_hidden_layers} if "devices" in params else {}
    return cls(model.config, batch, dtype=model.dtype, **extra)


def _full_mask(cache) -> bool:
    """Whether the cache has attention layers: they take the whole mask, state layers its last column."""
    from ..flatten import flatten_cache

    return any(n.endswith(".key") for n in flatten_cache(cache)[0])


@torch.no_grad()
def step_generate(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy generation one token per call from a zero state; returns the generated tokens."""
    kwarg, params = cache_kwarg(model), forward_params(model)
    batch, length = input_ids.shape
    cache, tokens = zero_state(model, batch), []
    ids, mask, first = input_ids, attention_mask, 0 if _full_mask(cache) else None
    for t in range(length + new_tokens - 1):
        step_mask = mask[:, first if first is not None else t : t + 1]
        inputs = {"input_ids": ids[:, t : t + 1], "attention_mask": step_mask, kwarg: cache, "use_cache": True}
        if "cache_position" in params:  # transformers 4 Mamba requires it, Jamba needs it past the first step
            inputs["cache_position"] = torch.tensor([t])
        out = model(**inputs)
        cache = cache_argument.of(out)
        if t >= length - 1:
            tokens.append(out.logits[:, -1].argmax(-1))
            ids = torch.cat([ids, tokens[-1][:, None]], dim=1)
            mask = torch.cat([mask, torch.ones(batch, 1, dtype=mask.dtype)], dim=1)
    return torch.stack(tokens, dim=1)
