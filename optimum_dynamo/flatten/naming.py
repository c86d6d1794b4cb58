"""optimum's names for flattened caches: `past_key_values.N.key` in, `present.N.key` out.

Mamba-style models call their cache `cache_params`, RWKV its state `state`: they get the same names
(`past_key_values.N.conv_state` in, `present.N.conv_state` out), so every exported decoder names its cache one way."""

from __future__ import annotations

INPUT_PREFIX = "past_key_values"
OUTPUT_PREFIX = "present"
CACHE_KWARGS = ("past_key_values", "cache_params", "state")


def input_name(kwarg: str, leaf: str) -> str:
    return f"{INPUT_PREFIX if kwarg in CACHE_KWARGS else kwarg}.{leaf}"


def output_name(field: str, leaf: str) -> str:
    return f"{OUTPUT_PREFIX if field in CACHE_KWARGS else field}.{leaf}"
