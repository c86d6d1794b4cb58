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
_BART = dict(
    d_model=32, encoder_ffn_dim=64, decoder_ffn_dim=64, encoder_layers=2, decoder_layers=2,
    encoder_attention_heads=4, decoder_attention_heads=4, vocab_size=128, max_position_embeddings=128,
    decoder_start_token_id=2,
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
    "bert": _ENCODER,
    "roberta": _ENCODER,
    "electra": dict(_ENCODER, embedding_size=32),
    "deberta-v2": dict(_ENCODER, pooler_hidden_size=32),
    "distilbert": dict(dim=32, n_layers=2, n_heads=4, hidden_dim=64, vocab_size=128, max_position_embeddings=128),
    "vit": dict(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=64),
    "convnext": dict(image_size=32, hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, num_channels=3),
    "resnet": dict(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic"),
    # encoder-decoders (seq2seq, speech)
    "t5": dict(d_model=32, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4, d_kv=8, vocab_size=128,
               decoder_start_token_id=0),
    "bart": dict(_BART, forced_bos_token_id=None, forced_eos_token_id=None),
    "mbart": dict(_BART, forced_bos_token_id=None, forced_eos_token_id=None),
    "marian": dict(_BART, decoder_vocab_size=128, decoder_start_token_id=0, forced_eos_token_id=None),
    "m2m_100": dict(_BART, forced_bos_token_id=None, forced_eos_token_id=None),
    "whisper": dict(_BART, num_mel_bins=16, max_source_positions=32, max_target_positions=64,
                    decoder_start_token_id=1, begin_suppress_tokens=None, suppress_tokens=None),
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


def save_tiny_speech_seq2seq(path: str | Path, *, seed: int = 0) -> Path:
    """A tiny Whisper (16 mel bins, 64 frames = 1 s of 16 kHz audio), its feature extractor and a tokenizer."""
    from transformers import WhisperFeatureExtractor

    path = save_tiny_model("whisper", "automatic-speech-recognition", path, seed=seed)
    WhisperFeatureExtractor(feature_size=16, sampling_rate=16000, hop_length=250, chunk_length=1, n_fft=400).save_pretrained(path)
    return path


def save_tiny_vision_seq2seq(path: str | Path, *, seed: int = 0) -> Path:
    """A tiny VisionEncoderDecoderModel (ViT encoder, GPT-2 decoder with cross-attention), its image
    processor and a tokenizer."""
    from transformers import GenerationConfig, ViTImageProcessor, VisionEncoderDecoderConfig, VisionEncoderDecoderModel

    path = Path(path)
    torch.manual_seed(seed)
    decoder = tiny_config("gpt2", is_decoder=True, add_cross_attention=True)
    config = VisionEncoderDecoderConfig.from_encoder_decoder_configs(tiny_config("vit"), decoder)
    config.decoder_start_token_id, config.pad_token_id, config.eos_token_id = 1, 0, 2
    model = VisionEncoderDecoderModel(config=config).eval()
    model.generation_config = GenerationConfig(decoder_start_token_id=1, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model.save_pretrained(path)
    ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(path)
    tiny_tokenizer(decoder.vocab_size).save_pretrained(path)
    return path
