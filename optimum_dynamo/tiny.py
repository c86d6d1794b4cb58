"""Tiny checkpoints built locally (random weights, a small trained tokenizer): demo and tests.

The Hub is never contacted: configs come from `AutoConfig.for_model`, shrunk.
"""

from __future__ import annotations

from pathlib import Path

import torch

# Shrunk sizes shared by every decoder; per-type overrides below.
_DECODER = dict(
    vocab_size=128,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    head_dim=8,
)
_ENCODER = dict(
    vocab_size=128,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=128,
)
# Full constructor kwargs per model type; types not listed are decoders with _DECODER sizes.
_SIZES = {
    "gpt2": dict(n_embd=32, n_layer=2, n_head=4, n_positions=128, vocab_size=128),
    "gemma2": dict(_DECODER, head_dim=16, query_pre_attn_scalar=16, sliding_window=64),
    "phi3": {k: v for k, v in _DECODER.items() if k != "head_dim"},
    "mixtral": dict(_DECODER, num_local_experts=4, num_experts_per_tok=2),
    "qwen2_moe": dict(_DECODER, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                      shared_expert_intermediate_size=32),
    "qwen3_moe": dict(_DECODER, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32),
    "mamba": dict(vocab_size=128, hidden_size=32, state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4,
                  time_step_rank=4, use_mambapy=False),
    "falcon_mamba": dict(vocab_size=128, hidden_size=32, state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4,
                         time_step_rank=4, use_mambapy=False),
    "jamba": dict(_DECODER, num_experts=4, num_experts_per_tok=2, expert_layer_period=2, expert_layer_offset=1,
                  attn_layer_period=2, attn_layer_offset=1, mamba_d_state=8, mamba_d_conv=4, mamba_expand=2,
                  mamba_dt_rank=4, use_mamba_kernels=False),
    "lfm2": dict(_DECODER, layer_types=["conv", "full_attention"], block_ff_dim=64, conv_L_cache=3,
                 block_auto_adjust_ff_dim=False),
    "zamba": dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=5, num_attention_heads=4,
                  num_key_value_heads=4, attention_head_dim=16, max_position_embeddings=128, attn_layer_period=2,
                  attn_layer_offset=1, mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=4,
                  n_mamba_heads=2, use_mamba_kernels=False),
    "qwen3_next": dict(_DECODER, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                       shared_expert_intermediate_size=32, linear_num_value_heads=4, linear_num_key_heads=2,
                       linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=4,
                       layer_types=["linear_attention", "full_attention"], partial_rotary_factor=0.5),
    "bert": _ENCODER,
    "roberta": _ENCODER,
    "electra": dict(_ENCODER, embedding_size=32),
    "deberta-v2": dict(_ENCODER, pooler_hidden_size=32),
    "distilbert": dict(dim=32, n_layers=2, n_heads=4, hidden_dim=64, vocab_size=128, max_position_embeddings=128),
    "vit": dict(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=64),
    "convnext": dict(image_size=32, hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, num_channels=3),
    "resnet": dict(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic"),
}

_CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "a tiny model speaks in random words",
    "hello world from the dynamo exporter",
    "optimum exports models to onnx for fast inference",
]


def tiny_config(model_type: str, **overrides):
    from transformers import AutoConfig

    kwargs = dict(_SIZES.get(model_type, _DECODER), **overrides)
    config = AutoConfig.for_model(model_type, **kwargs)
    config.pad_token_id = 0
    config.bos_token_id, config.eos_token_id = 1, 2
    return config


def tiny_tokenizer(vocab_size: int = 128):
    """A word-level tokenizer trained on a few sentences (ids < vocab_size), left padding."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "<s>", "</s>", "<unk>"])
    tok.train_from_iterator(_CORPUS, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        padding_side="left",
    )


def save_tiny_decoder(model_type: str, path: str | Path, *, seed: int = 0, tokenizer: bool = True, **overrides) -> Path:
    """Write a tiny causal LM of `model_type` (and a tokenizer) to `path`; return the path."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    path = Path(path)
    torch.manual_seed(seed)
    config = tiny_config(model_type, **overrides)
    model = AutoModelForCausalLM.from_config(config).eval()
    model.generation_config = GenerationConfig(pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model.save_pretrained(path)
    if tokenizer:
        tiny_tokenizer(config.vocab_size).save_pretrained(path)
    return path


def save_tiny_model(model_type: str, task: str, path: str | Path, *, seed: int = 0, **overrides) -> Path:
    """Write a tiny model of `model_type` for an optimum `task` (and a tokenizer for text models)."""
    from optimum.exporters.tasks import TasksManager

    path = Path(path)
    torch.manual_seed(seed)
    config = tiny_config(model_type, **overrides)
    model_class = TasksManager.get_model_class_for_task(task, library="transformers")
    model = model_class.from_config(config).eval()
    model.save_pretrained(path)
    if getattr(config, "vocab_size", None):
        tiny_tokenizer(config.vocab_size).save_pretrained(path)
    return path
