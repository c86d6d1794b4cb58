"""optimum's names for flattened caches: `past_key_values.N.key` in, `present.N.key` out."""

from __future__ import annotations

INPUT_PREFIX = "past_key_values"
OUTPUT_PREFIX = "present"


def input_name(kwarg: str, leaf: str) -> str:
    return f"{INPUT_PREFIX if kwarg == 'past_key_values' else kwarg}.{leaf}"


def output_name(field: str, leaf: str) -> str:
    return f"{OUTPUT_PREFIX if field == 'past_key_values' else field}.{leaf}"
