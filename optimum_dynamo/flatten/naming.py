"""optimum's names for flattened caches: `past_key_values.N.key` in, `present.N.key` out.

Whatever transformers calls the cache (`cache` since 5.24, `past_key_values` before, `cache_params` for Mamba-style
models, RWKV's `state`: `legacy_bridge.cache_argument`), it gets the same names (`past_key_values.N.conv_state` in,
`present.N.conv_state` out), so every exported graph names its cache one way, the way optimum's runtimes read it."""

from __future__ import annotations

from legacy_bridge import cache_argument

INPUT_PREFIX = "past_key_values"
OUTPUT_PREFIX = "present"
CACHE_KWARGS = cache_argument.NAMES


def input_name(kwarg: str, leaf: str) -> str:
    return f"{INPUT_PREFIX if kwarg in CACHE_KWARGS else kwarg}.{leaf}"


def output_name(field: str, leaf: str) -> str:
    return f"{OUTPUT_PREFIX if field in CACHE_KWARGS else field}.{leaf}"
