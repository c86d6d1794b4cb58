"""First-step empty cache of ORTModelForCausalLM (optimum-onnx 0.1.0), on transformers 4 and 5.

`__init__` takes the kv-head count from a model-type allowlist (else `num_attention_heads`) and the head
dim from `hidden_size // num_attention_heads`, so the empty cache of grouped-query models outside the list
(phi3, gemma2, olmo, ...) has the wrong shape and onnxruntime rejects it. The wrapper reads both from the
session's `past_key_values.0.key` input ([batch, kv_heads, past, head_dim]) when static, else the config.
"""

from __future__ import annotations

import functools
import sys

from ._hooks import when_imported

_MODULE = "optimum.onnxruntime.modeling_decoder"
_CACHE_INPUT = "past_key_values.0.key"
_original_init = None
_enabled = False


def cache_dims(model) -> tuple[int | None, int | None]:
    """(kv_heads, head_dim) of the session's cache input if static, else from the config (None if unknown)."""
    shape = list(model.input_shapes.get(_CACHE_INPUT) or ())
    kv_heads, head_dim = (shape[1], shape[3]) if len(shape) == 4 else (None, None)
    config = model.config.get_text_config(decoder=True) if hasattr(model.config, "get_text_config") else model.config
    if not isinstance(kv_heads, int):
        kv_heads = getattr(config, "num_key_value_heads", None)
    if not isinstance(head_dim, int):
        head_dim = getattr(config, "head_dim", None)
    return kv_heads, head_dim


def _fix(model) -> None:
    # Legacy bloom / fused gpt_bigcode caches are not 4-d; deepseek_v3 has distinct k and v head dims.
    if not model.can_use_cache or getattr(model, "old_bloom_modeling", False):
        return
    if getattr(model, "old_gpt_bigcode_modeling", False):
        return
    if model.config.model_type == "deepseek_v3":
        return
    kv_heads, head_dim = cache_dims(model)
    if kv_heads:
        model.num_key_value_heads = kv_heads
    if head_dim:
        model.embed_size_per_head = head_dim


def _patch(module) -> None:
    global _original_init
    cls = module.ORTModelForCausalLM
    if not _enabled or _original_init is not None:
        return
    original = _original_init = cls.__init__

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        _fix(self)

    cls.__init__ = __init__


def install() -> None:
    global _enabled
    if not _enabled:
        _enabled = True
        when_imported(_MODULE, _patch)


def uninstall() -> None:
    """Restore the original `__init__` (models built before keep their fixed sizes)."""
    global _original_init, _enabled
    _enabled = False
    module = sys.modules.get(_MODULE)
    if module is not None and _original_init is not None:
        module.ORTModelForCausalLM.__init__ = _original_init
    _original_init = None
