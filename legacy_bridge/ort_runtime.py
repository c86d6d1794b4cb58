"""Runtime fixes of ORTModelForCausalLM (optimum-onnx 0.1.0), on transformers 4 and 5.

- Cache sizes: `__init__` takes the kv-head count from a model-type allowlist (else `num_attention_heads`)
  and the head dim from `hidden_size // num_attention_heads`, so the empty first-step cache of
  grouped-query models outside the list (phi3, gemma2, olmo, ...) has the wrong shape and onnxruntime
  rejects it. The wrapper reads both from the session's `past_key_values.0.key` input
  ([batch, kv_heads, past, head_dim]) when static, else the config.
- Per-layer cache sizes: `forward` builds every empty first-step cache with those single sizes; when the
  graph's cache inputs differ per layer (gemma4) or are not [batch, heads, past, head_dim] (a sparse-attention
  indexer's [batch, past, dim] keys), each empty cache takes its own input's static shape.
- State graphs (mamba, hybrids): their own `__init__` bookkeeping and a token-by-token `forward`
  (`ort_states`).
- Default positions: without `position_ids`, `forward` counts positions 0.. from the first token of each
  row (opt and old gpt_bigcode aside). Where the PyTorch model derives them otherwise (from the padding
  index or the attention mask: the rule the export recorded, `positions`), the wrapper does the same, so a
  plain call on a left-padded row gets PyTorch's logits; likewise the positions `generate` prepares.
"""

from __future__ import annotations

from . import ort_states, positions
from .hooks import MethodPatch

_MODULE = "optimum.onnxruntime.modeling_decoder"
_CACHE_INPUT = "past_key_values.0.key"


def cache_dims(model) -> tuple[int | None, int | None]:
    """(kv_heads, head_dim) of the session's cache input if static, else from the config (None if unknown)."""
    shape = list(model.input_shapes.get(_CACHE_INPUT) or ())
    kv_heads, head_dim = (shape[1], shape[3]) if len(shape) == 4 else (None, None)
    config = model.config.get_text_config(decoder=True) if hasattr(model.config, "get_text_config") else model.config
    if not isinstance(kv_heads, int):
        kv_heads = global_size(config, "num_key_value_heads")
    if not isinstance(head_dim, int):
        head_dim = global_size(config, "head_dim")
    return kv_heads, head_dim


def global_size(config, name: str, absent=None):
    """`config.<name>`: `absent` where the config has none, None where it varies per layer (transformers 5.24's
    per-layer configs, gemma4's `head_dim`, refuse a global read: the graph's cache shapes then give each
    layer's)."""
    try:
        return getattr(config, name, absent)
    except RuntimeError as error:
        if type(error).__name__ != "AmbiguousGlobalPerLayerAttributeError":
            raise
        return None


def _standard_cache(model) -> bool:
    """4-d [batch, heads, past, head_dim] caches (not legacy bloom / fused gpt_bigcode / deepseek_v3)."""
    if not model.can_use_cache or getattr(model, "old_bloom_modeling", False):
        return False
    if getattr(model, "old_gpt_bigcode_modeling", False):
        return False
    return model.config.model_type != "deepseek_v3"


def _fix(model) -> None:
    if not _standard_cache(model):
        return
    kv_heads, head_dim = cache_dims(model)  # set only where optimum's own value differs (main fixed qwen2/3)
    if kv_heads and kv_heads != model.num_key_value_heads:
        model.num_key_value_heads = kv_heads
    if head_dim and head_dim != model.embed_size_per_head:
        model.embed_size_per_head = head_dim


def empty_cache(model, batch: int) -> tuple | None:
    """Empty first-step caches, one per cache input in its own static shape; None when every input has the
    single shape optimum builds itself (or a shape is not static)."""
    names = list(model.key_value_input_names)
    if not names or model.is_merged or not _standard_cache(model):
        return None
    shapes = [list(model.input_shapes.get(name) or ()) for name in names]
    if any(len(s) < 3 or not all(isinstance(d, int) for d in s[1:-2] + s[-1:]) for s in shapes):
        return None
    if all(len(s) == 4 and (s[1], s[3]) == (model.num_key_value_heads, model.embed_size_per_head) for s in shapes):
        return None
    import torch

    empty = [torch.zeros((batch, *s[1:-2], 0, s[-1]), dtype=model.dtype, device=model.device) for s in shapes]
    return tuple(tuple(empty[i : i + 2]) for i in range(0, len(empty), 2))


def default_positions(model, recorded: dict) -> str | None:
    """The graph's recorded default-positions rule (`positions`), else biogpt's on transformers 4 (a
    torchscript export records none), else None: optimum's own count from each row's first token."""
    rule = recorded.get(positions.METADATA_KEY)
    if rule or model.config.model_type != "biogpt":
        return rule or None
    import transformers
    from packaging.version import Version

    return "mask" if Version(transformers.__version__) < Version("5") else None  # 5 counts 0.. like the runtime


_TEXT_SIZES = ("hidden_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers", "head_dim")


def lift_text_sizes(config, decoder: bool | None = None) -> None:
    """A multimodal checkpoint exported as a causal LM (got_ocr2, fuyu, ...) keeps its sizes in the text
    sub-config (`decoder=True`: the decoder's, of an encoder-decoder); optimum's runtime reads them from the top
    (hidden_size // num_attention_heads): copy the missing ones onto the loaded config object (not saved; the
    graph's own shapes then correct them)."""
    has = config is not None and hasattr(config, "get_text_config")
    text = config.get_text_config(decoder=decoder) if has else config
    if text is None or text is config:
        return
    missing = object()
    for name in _TEXT_SIZES:
        if global_size(config, name, missing) is missing and (value := global_size(text, name)) is not None:
            setattr(config, name, value)


def _past_length(past_key_values) -> int:
    return past_key_values[0][1].shape[-2] if past_key_values is not None else 0


def _patch(cls, _original: dict) -> None:
    import functools

    init, forward = _original["__init__"], _original["forward"] = cls.__init__, cls.forward

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        if ort_states.is_state_session(kwargs.get("session")):
            generation_config = kwargs.pop("generation_config", None)
            super(cls, self).__init__(*args, **kwargs)  # optimum's ORTModel; its key/value sizes do not apply
            ort_states.adopt(self, generation_config)
            return
        lift_text_sizes(kwargs.get("config", args[0] if args else None))
        init(self, *args, **kwargs)
        _fix(self)
        recorded = self.session.get_modelmeta().custom_metadata_map
        self.positions_rule = default_positions(self, recorded)
        self.generate_positions_rule = recorded.get(positions.GENERATE_KEY)

    @functools.wraps(forward)
    def wrapped_forward(self, input_ids, attention_mask=None, past_key_values=None, position_ids=None, **kwargs):
        if isinstance(getattr(self, "state_graph", None), ort_states.StateGraph):
            return ort_states.forward(self, input_ids, attention_mask, past_key_values, position_ids, **kwargs)
        if position_ids is None and "position_ids" in self.input_names and getattr(self, "positions_rule", None):
            past = _past_length(past_key_values)
            mask = input_ids.new_ones((input_ids.shape[0], past + input_ids.shape[1])) if attention_mask is None else attention_mask
            position_ids = positions.positions(self.positions_rule, input_ids, mask, past)
        if past_key_values is None:
            past_key_values = empty_cache(self, input_ids.shape[0])
        return forward(self, input_ids, attention_mask, past_key_values, position_ids, **kwargs)

    prepare = _original["prepare_inputs_for_generation"] = cls.prepare_inputs_for_generation

    @functools.wraps(prepare)
    def prepare_inputs_for_generation(self, *args, **kwargs):
        inputs = prepare(self, *args, **kwargs)
        rule = getattr(self, "generate_positions_rule", None)
        full = args[0] if args else kwargs.get("input_ids")  # the whole sequence so far (inputs: its new part)
        ids, mask = inputs.get("input_ids"), inputs.get("attention_mask")
        if rule and "position_ids" in self.input_names and full is not None and ids is not None and mask is not None:
            inputs["position_ids"] = positions.positions(rule, full, mask, 0)[:, -ids.shape[1]:]
        return inputs

    cls.__init__, cls.forward, cls.prepare_inputs_for_generation = __init__, wrapped_forward, prepare_inputs_for_generation


PATCH = MethodPatch(_MODULE, "ORTModelForCausalLM", _patch)
install, uninstall = PATCH.install, PATCH.uninstall  # uninstall: models built before keep their fixed sizes
