"""Tiny checkpoints built locally (random weights, a small trained tokenizer): demo and tests.

The Hub is never contacted: configs come from `AutoConfig.for_model`, shrunk.
"""

from __future__ import annotations

import functools
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
_NO_HEAD_DIM = {k: v for k, v in _DECODER.items() if k != "head_dim"}
_BASE = {k: v for k, v in _NO_HEAD_DIM.items() if k != "num_key_value_heads"}  # no GQA, head_dim derived
_HYBRID = ["sliding_attention", "full_attention"]
_LINEAR = dict(linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
               linear_conv_kernel_dim=4)
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
    # the decoder architecture sweep (tests/test_decoder_sweep.py); sliding windows are set by the test
    "mistral": _DECODER,
    "qwen2": _DECODER,
    "qwen3": _DECODER,
    "phi": dict(_NO_HEAD_DIM, num_key_value_heads=4, partial_rotary_factor=0.5),
    "gemma": _DECODER,
    "gemma3_text": dict(_DECODER, head_dim=16, query_pre_attn_scalar=16, layer_types=_HYBRID),
    "gpt_neox": dict(_BASE, rotary_pct=0.5),
    "gptj": dict(vocab_size=128, n_embd=32, n_layer=2, n_head=4, n_positions=128, rotary_dim=4, n_inner=64),
    "codegen": dict(vocab_size=128, n_embd=32, n_layer=2, n_head=4, n_positions=128, n_ctx=128, rotary_dim=4,
                    n_inner=64),
    "bloom": dict(vocab_size=128, hidden_size=32, n_layer=2, n_head=4),
    "falcon": dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                   max_position_embeddings=128),
    "opt": dict(vocab_size=128, hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=4,
                word_embed_proj_dim=32, max_position_embeddings=128),
    "gpt_bigcode": dict(vocab_size=128, n_embd=32, n_layer=2, n_head=4, n_positions=128, n_inner=64),
    "mpt": dict(vocab_size=128, d_model=32, n_heads=4, n_layers=2, max_seq_len=128, expansion_ratio=2),
    "starcoder2": _DECODER,
    "stablelm": dict(_NO_HEAD_DIM, partial_rotary_factor=0.5),
    "cohere": _DECODER,
    "cohere2": dict(_DECODER, layer_types=_HYBRID),
    "olmo": _DECODER,
    "olmo2": _DECODER,
    "olmo3": dict(_DECODER, layer_types=_HYBRID),
    "granite": _DECODER,
    "granitemoe": dict(_DECODER, num_local_experts=4, num_experts_per_tok=2),
    "helium": _DECODER,
    "glm": dict(_DECODER, partial_rotary_factor=0.5),
    "smollm3": _DECODER,
    "persimmon": dict(_BASE, partial_rotary_factor=0.5),
    "xglm": dict(vocab_size=128, d_model=32, ffn_dim=64, num_layers=2, attention_heads=4, max_position_embeddings=128),
    "biogpt": _BASE,
    "exaone4": dict(_DECODER, layer_types=_HYBRID),
    "ministral": dict(_DECODER, layer_types=_HYBRID),
    "gpt_oss": dict(_DECODER, num_local_experts=4, num_experts_per_tok=2, layer_types=_HYBRID),
    "arcee": _DECODER,
    "ernie4_5": _DECODER,
    "seed_oss": _DECODER,
    "apertus": _DECODER,
    "hunyuan_v1_dense": _DECODER,
    # multi-head latent attention and routed experts (smoke set: --dynamo cannot export it, the fallback can)
    "deepseek_v3": dict(_DECODER, num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=8,
                        qk_rope_head_dim=8, v_head_dim=8, n_routed_experts=4, num_experts_per_tok=2, n_group=1,
                        topk_group=1, moe_intermediate_size=32, first_k_dense_replace=1),
    # recurrent state (SSM, convolution, linear attention)
    "recurrent_gemma": dict(_DECODER, num_key_value_heads=1, lru_width=32, attention_window_size=6, conv1d_width=4,
                            block_types=["recurrent", "attention"], partial_rotary_factor=0.5),
    # transformers 5 only
    # per-layer cache shapes: head_dim 16 on the sliding layer, 32 on the full one
    "gemma4_text": dict(_DECODER, head_dim=16, global_head_dim=32, layer_types=_HYBRID, vocab_size_per_layer_input=128,
                        hidden_size_per_layer_input=8),
    "ministral3": _DECODER,
    "granite_swa": dict(_DECODER, layer_types=_HYBRID),
    "granitemoe_swa": dict(_DECODER, num_local_experts=4, num_experts_per_tok=2, layer_types=_HYBRID),
    "cohere2_moe": dict(_DECODER, num_experts=4, num_experts_per_tok=2, layer_types=_HYBRID),
    "cwm": dict(_DECODER, layer_types=_HYBRID),
    "nanochat": _DECODER,
    "internlm3": _DECODER,
    "jais2": _DECODER,
    "hyperclovax": _DECODER,
    "iquestcoder": _DECODER,
    # multi-head latent attention (needs as many kv heads as heads); its key/value latents are cached
    "minicpm3": dict(_DECODER, num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8),
    # sparse attention: the indexer's keys are cached beside the latents (first layer; the second reuses its top-k)
    "hy_v4": dict(_DECODER, num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=8,
                  qk_rope_head_dim=8, v_head_dim=8, index_head_dim=16, index_n_heads=2,
                  indexer_types=["full", "shared"], n_routed_experts=4, num_experts_per_tok=2,
                  moe_intermediate_size=32),
    "qwen3_5_text": dict(_DECODER, layer_types=["linear_attention", "full_attention"], **_LINEAR),
    "qwen3_5_moe_text": dict(_DECODER, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                             shared_expert_intermediate_size=32, layer_types=["linear_attention", "full_attention"],
                             **_LINEAR),
    "lfm2_moe": dict(_DECODER, layer_types=["conv", "full_attention"], num_experts=4, num_experts_per_tok=2,
                     moe_intermediate_size=32, num_dense_layers=1, conv_L_cache=3),
    "olmo_hybrid": dict(_DECODER, layer_types=["linear_attention", "full_attention"]),
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
    "zamba2": dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                   num_key_value_heads=4, layers_block_type=["mamba", "hybrid", "mamba"], mamba_d_state=8,
                   mamba_d_conv=4, mamba_expand=2, mamba_ngroups=1, n_mamba_heads=4, chunk_size=8,
                   adapter_rank=8, use_mamba_kernels=False),
    "mamba2": dict(vocab_size=128, hidden_size=32, state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4,
                   num_heads=4, head_dim=16, n_groups=1, chunk_size=8),
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
    "segformer": dict(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[8, 16],
                      num_attention_heads=[1, 2], decoder_hidden_size=16, num_labels=4, image_size=32),
    "glpn": dict(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[8, 16], num_attention_heads=[1, 2],
                 decoder_hidden_size=16, patch_sizes=[7, 3], strides=[4, 2], mlp_ratios=[2, 2]),
    # 4 x 4 patches (the default 224 / 32 gives 7 x 7; see docs/status.md for what its graph does there)
    "idefics3_vision": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                            image_size=32, patch_size=8),
    "yolos": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=[32, 32],
                  patch_size=8, num_detection_tokens=5, num_labels=3),
    "clip": dict(text_config=dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, max_position_embeddings=64, bos_token_id=1, eos_token_id=2,
                                  pad_token_id=0),
                 vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                    image_size=32, patch_size=8), projection_dim=16),
    # GroupViT: its three stages of grouping tokens at a tenth (the default is 384 wide, 12 + 12 layers, 224 px)
    "groupvit": dict(text_config=dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, max_position_embeddings=64, bos_token_id=1,
                                      eos_token_id=2, pad_token_id=0),
                     vision_config=dict(image_size=32, patch_size=8, hidden_size=32, intermediate_size=64,
                                        depths=[1, 1, 1], num_group_tokens=[8, 4, 0], num_output_groups=[8, 4, 4],
                                        num_attention_heads=4),
                     projection_dim=32, projection_intermediate_dim=64),
    "metaclip_2": dict(text_config=dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, max_position_embeddings=64, bos_token_id=1,
                                        eos_token_id=2, pad_token_id=0),
                       vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                          num_attention_heads=4, image_size=32, patch_size=8), projection_dim=16),
    # raw-waveform speech encoders: two conv layers (a 20-sample stride)
    "wav2vec2": dict(_W2V := dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                  conv_dim=(16, 16), conv_stride=(5, 4), conv_kernel=(10, 8), num_conv_pos_embeddings=16,
                                  num_conv_pos_embedding_groups=2, vocab_size=20), num_labels=3),
    "hubert": dict(_W2V, num_labels=3),
    "wav2vec2-bert": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                          output_hidden_size=32, conv_depthwise_kernel_size=5, vocab_size=20, num_labels=3),
    "parakeet_ctc": dict(encoder_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                             num_key_value_heads=4, intermediate_size=64, num_mel_bins=16,
                                             subsampling_conv_channels=16), vocab_size=20),
    "omniasr_ctc": dict(audio_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                          intermediate_size=64, conv_dim=[16, 16], conv_stride=[5, 4],
                                          conv_kernel=[10, 8], num_conv_pos_embeddings=16,
                                          num_conv_pos_embedding_groups=2), vocab_size=20),
    "wav2vec2:xvector": dict(_W2V, tdnn_dim=(16, 16), tdnn_kernel=(3, 1), tdnn_dilation=(1, 1), xvector_output_dim=8),
    # encoder-decoders (seq2seq, speech)
    "t5": dict(d_model=32, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4, d_kv=8, vocab_size=128,
               decoder_start_token_id=0),
    "bart": dict(_BART, forced_bos_token_id=None, forced_eos_token_id=None),
    "mbart": dict(_BART, forced_bos_token_id=None, forced_eos_token_id=None),
    "marian": dict(_BART, decoder_vocab_size=128, decoder_start_token_id=0, forced_eos_token_id=None),
    "m2m_100": dict(_BART, forced_bos_token_id=None, forced_eos_token_id=None),
    "bigbird_pegasus": dict(_BART, forced_eos_token_id=None),
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
    kwargs = {k: v for k, v in kwargs.items() if v is not None or k not in _DECODER}  # None drops a size
    config = AutoConfig.for_model(model_type.split(":")[0], **kwargs)  # "type:variant": a variant's sizes
    config.pad_token_id = 0
    config.bos_token_id, config.eos_token_id = 1, 2
    return config


def tiny_tokenizer(vocab_size: int = 128, extra: dict[str, str] | None = None, cls=None):
    """A word-level tokenizer trained on a few sentences (ids < vocab_size), left padding.
    `extra`: named special tokens (e.g. {"image_token": "<image>"}), ids 4, 5, ... in order. `cls`: the fast
    tokenizer class to wrap it in (default PreTrainedTokenizerFast; a processor of transformers 4.57 may check)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    specials = ["<pad>", "<s>", "</s>", "<unk>", *(extra or {}).values()]
    trainer = trainers.WordLevelTrainer(vocab_size=vocab_size, special_tokens=specials)
    tok.train_from_iterator(_CORPUS, trainer)
    return (cls or PreTrainedTokenizerFast)(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        padding_side="left",
        **({"extra_special_tokens": extra} if extra else {}),
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


_NEEDS_PAD = {"roberta"}  # real checkpoints always set it: position ids are counted from the padding index


def save_tiny_model(model_type: str, task: str, path: str | Path, *, seed: int = 0, bare: bool = False,
                    **overrides) -> Path:
    """Write a tiny model of `model_type` for an optimum `task` (and a tokenizer for text models).
    `bare=True`: as many users have them, `model.save_pretrained` only (no tokenizer or processor files)
    and `pad_token_id` unset (except where the model needs it: roberta's position ids)."""
    from optimum.exporters.tasks import TasksManager

    path = Path(path)
    torch.manual_seed(seed)
    config = tiny_config(model_type, **overrides)
    if bare and model_type not in _NEEDS_PAD:
        config.pad_token_id = None
    model_class = TasksManager.get_model_class_for_task(task, library="transformers")
    model = model_class.from_config(config).eval()
    if bare and model_type not in _NEEDS_PAD and getattr(model, "generation_config", None) is not None:
        model.generation_config.pad_token_id = None
    model.save_pretrained(path)
    if getattr(config, "vocab_size", None) and not bare:
        tiny_tokenizer(config.vocab_size).save_pretrained(path)
    return path


# Tiny vision-language models: a 32x32 image in 8x8 patches, the _DECODER text sizes.
_VISION = dict(image_size=32, patch_size=8, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
# Idefics3's prompt tokens (tiles are marked <row_i_col_j>: up to 2x2 tiles here), in the tokenizer's vocabulary
_IDEFICS3_TOKENS = {"fake_image_token": "<fake_token_around_image>", "image_token": "<image>",
                    "end_of_utterance_token": "<end_of_utterance>", "global_image_token": "<global-img>",
                    **{f"row_{i}_col_{j}": f"<row_{i}_col_{j}>" for i in (1, 2) for j in (1, 2)}}
_VLM = {
    "gemma3": dict(
        vision=dict(_VISION, model_type="siglip_vision_model"),
        text=dict(head_dim=16, query_pre_attn_scalar=16, sliding_window=64, layer_types=["sliding_attention", "full_attention"]),
        config=dict(mm_tokens_per_image=4, image_token_index=4, boi_token_index=5, eoi_token_index=6),
        tokens={"image_token": "<image_soft_token>", "boi_token": "<start_of_image>", "eoi_token": "<end_of_image>"},
    ),
    "llava": dict(
        vision=dict(_VISION, model_type="clip_vision_model", projection_dim=32),
        text=dict(model_type="llama"),
        config=dict(image_token_index=4, projector_hidden_act="gelu", vision_feature_layer=-2),
        tokens={"image_token": "<image>"},
    ),
    "paligemma": dict(  # the processor puts the image tokens first, then <s> and the text
        vision=dict(_VISION, model_type="siglip_vision_model", projection_dim=32),
        text=dict(model_type="gemma", head_dim=16),
        config=dict(image_token_index=4, projection_dim=32, hidden_size=32),
        tokens={"image_token": "<image>"},
    ),
    "aya_vision": dict(  # pixel shuffle (2x2) before the projector: 4 image tokens
        vision=dict(_VISION, model_type="siglip_vision_model"),
        text=dict(model_type="cohere2", layer_types=["full_attention", "full_attention"]),
        config=dict(image_token_index=7, downsample_factor=2),
        tokens={"image_token": "<image>", "start_of_img_token": "<|START_OF_IMG|>", "end_of_img_token": "<|END_OF_IMG|>",
                "img_patch_token": "<|IMG_PATCH|>", "img_line_break_token": "<|IMG_LINE_BREAK|>",
                "tile_global_token": "TILE_GLOBAL"},
    ),
    "internvl": dict(  # pixel shuffle (0.5) in get_image_features, outside the projector: 4 image tokens
        vision=dict(_VISION, model_type="internvl_vision"),
        text=dict(model_type="qwen2"),
        config=dict(image_token_id=6, image_seq_length=4),
        tokens={"start_image_token": "<img>", "end_image_token": "</img>", "context_image_token": "<IMG_CONTEXT>",
                "video_token": "<video>"},
    ),
    "qwen2_vl": dict(  # 8x8 patches merged 2x2: a 32x32 image is 16 patches, 4 image tokens
        vision=dict(depth=2, embed_dim=32, hidden_size=32, num_heads=4, patch_size=8, spatial_merge_size=2, mlp_ratio=2),
        text=dict(rope_scaling={"type": "mrope", "mrope_section": [1, 1, 2]}),
        config=dict(image_token_id=4, video_token_id=5, vision_start_token_id=6, vision_end_token_id=7),
        tokens={"image_token": "<|image_pad|>", "video_token": "<|video_pad|>", "vision_start_token": "<|vision_start|>",
                "vision_end_token": "<|vision_end|>"},
    ),
    "qwen2_5_vl": dict(  # Qwen2-VL's patches; windows of 2x2 merged patches (32 pixels), full attention in layer 1
        vision=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=4, out_hidden_size=32, patch_size=8,
                    spatial_merge_size=2, window_size=32, fullatt_block_indexes=[1]),
        text=dict(rope_scaling={"type": "mrope", "mrope_section": [1, 1, 2]}),
        config=dict(image_token_id=4, video_token_id=5, vision_start_token_id=6, vision_end_token_id=7),
        tokens={"image_token": "<|image_pad|>", "video_token": "<|video_pad|>", "vision_start_token": "<|vision_start|>",
                "vision_end_token": "<|vision_end|>"},
    ),
    "qwen3_vl": dict(  # Qwen2-VL's patches; deepstack: the tower's layer 0 features added in decoder layer 0
        vision=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=4, out_hidden_size=32, patch_size=8,
                    spatial_merge_size=2, num_position_embeddings=16, deepstack_visual_indexes=[0]),
        text=dict(head_dim=8, rope_scaling={"rope_type": "default", "mrope_section": [1, 1, 2], "mrope_interleaved": True}),
        config=dict(image_token_id=4, video_token_id=5, vision_start_token_id=6, vision_end_token_id=7),
        tokens={"image_token": "<|image_pad|>", "video_token": "<|video_pad|>", "vision_start_token": "<|vision_start|>",
                "vision_end_token": "<|vision_end|>"},
    ),
    "llava_next": dict(  # anyres: a 48x48 image is a 64x64 grid of four 32x32 tiles beside the whole image
        vision=dict(_VISION, model_type="clip_vision_model", projection_dim=32),
        text=dict(model_type="llama"),
        config=dict(image_token_index=4, projector_hidden_act="gelu", vision_feature_layer=-2,
                    image_grid_pinpoints=[[32, 32], [32, 64], [64, 32], [64, 64]]),
        tokens={"image_token": "<image>"},
    ),
    "mistral3": dict(  # Pixtral: images at their own size (multiples of 16), 2x2 patches merged
        vision=dict(_VISION, model_type="pixtral", image_size=64, head_dim=8),
        text=dict(model_type="mistral"),
        config=dict(image_token_index=4, spatial_merge_size=2, vision_feature_layer=-1),
        tokens={"image_token": "[IMG]", "image_break_token": "[IMG_BREAK]", "image_end_token": "[IMG_END]"},
    ),
    "idefics3": dict(  # 32x32 tiles, pixel shuffle (2x2) in the connector: 4 image tokens per tile
        vision=dict(_VISION, model_type="idefics3_vision"),
        text=dict(model_type="llama"),
        config=dict(image_token_id=5, scale_factor=2),
        tokens=_IDEFICS3_TOKENS,
    ),
    "smolvlm": dict(
        vision=dict(_VISION, model_type="smolvlm_vision"),
        text=dict(model_type="llama"),
        config=dict(image_token_id=5, scale_factor=2),
        tokens=_IDEFICS3_TOKENS,
    ),
}


def tiny_vlm_config(model_type: str, **text_overrides):
    from transformers import AutoConfig

    spec = _VLM[model_type]
    text = dict(_DECODER, pad_token_id=0, bos_token_id=1, eos_token_id=2, **dict(spec["text"], **text_overrides))
    return AutoConfig.for_model(model_type, text_config=text, vision_config=spec["vision"], **spec["config"])


@functools.cache
def _internvl_images_processor():
    """InternVL's processor without its video processor, whose class needs torchvision (not installed here): what a
    user without torchvision builds. Registered, so `AutoProcessor` loads it back in this process."""
    from transformers import AutoProcessor, InternVLConfig, InternVLProcessor

    class InternVLImagesProcessor(InternVLProcessor):
        attributes = ["image_processor", "tokenizer"]  # 4.57 reads this; 5 reads the signature

        def __init__(self, image_processor=None, tokenizer=None, image_seq_length=256, chat_template=None, **kwargs):
            super().__init__(image_processor, tokenizer, None, image_seq_length, chat_template, **kwargs)

    AutoProcessor.register(InternVLConfig, InternVLImagesProcessor, exist_ok=True)
    return InternVLImagesProcessor


def _tiny_processor(model_type: str, config):
    """The model's processor over a tiny image processor (32x32) and the tiny tokenizer with its image tokens."""
    from transformers import (AyaVisionProcessor, CLIPImageProcessor, Gemma3ImageProcessor, Gemma3Processor,
                              GotOcr2ImageProcessor, LlavaProcessor, PaliGemmaProcessor, SiglipImageProcessor)

    tokens = _VLM[model_type]["tokens"]
    tokenizer = tiny_tokenizer(config.text_config.vocab_size, extra=tokens)
    if model_type == "gemma3":
        images = Gemma3ImageProcessor(size={"height": 32, "width": 32})
        return Gemma3Processor(images, tokenizer, image_seq_length=config.mm_tokens_per_image)
    if model_type == "paligemma":
        from transformers import GemmaTokenizerFast  # 4.57's processor takes only Gemma's tokenizer class

        images = SiglipImageProcessor(size={"height": 32, "width": 32}, image_seq_length=16)
        gemma = GemmaTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer, pad_token="<pad>", bos_token="<s>",
                                   eos_token="</s>", unk_token="<unk>", padding_side="left")
        gemma.add_special_tokens({"additional_special_tokens": ["<image>"]})
        return PaliGemmaProcessor(images, gemma)
    if model_type == "llava_next":
        from transformers import LlavaNextImageProcessor, LlavaNextProcessor

        images = LlavaNextImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32},
                                         image_grid_pinpoints=config.image_grid_pinpoints)
        return LlavaNextProcessor(images, tokenizer, patch_size=8, vision_feature_select_strategy="default",
                                  num_additional_image_tokens=1, image_token=tokens["image_token"])
    if model_type == "mistral3":
        from transformers import PixtralImageProcessor, PixtralProcessor

        images = PixtralImageProcessor(size={"longest_edge": 64}, patch_size={"height": 16, "width": 16})
        return PixtralProcessor(images, tokenizer, patch_size=8, spatial_merge_size=2, **tokens)
    if model_type in ("idefics3", "smolvlm"):  # images split into 32x32 tiles (up to 2x2) and a global one
        from transformers import Idefics3ImageProcessor, Idefics3Processor

        # SmolVLMProcessor needs num2words and torchvision (its video processor), not installed here: SmolVLM's
        # image prompt is Idefics3's (same tile markers and image tokens)
        images = Idefics3ImageProcessor(size={"longest_edge": 64}, max_image_size={"longest_edge": 32})
        return Idefics3Processor(images, tokenizer, image_seq_len=4)
    if model_type == "aya_vision":  # one 32x32 tile per image, no thumbnail tiles
        images = GotOcr2ImageProcessor(size={"height": 32, "width": 32}, crop_to_patches=False, max_patches=1)
        return AyaVisionProcessor(images, tokenizer, patch_size=8, img_size=32, downsample_factor=2)
    if model_type == "internvl":  # one 32x32 patch per image
        images = GotOcr2ImageProcessor(size={"height": 32, "width": 32}, crop_to_patches=False, max_patches=1)
        if _has_torchvision():  # the processor users have, its video part included
            from transformers import InternVLProcessor, InternVLVideoProcessor

            return InternVLProcessor(images, tokenizer, InternVLVideoProcessor(), image_seq_length=config.image_seq_length)
        return _internvl_images_processor()(images, tokenizer, image_seq_length=config.image_seq_length)
    if model_type in _QWEN_VL_PROCESSORS:
        return _qwen_vl_processor(tokenizer, model_type)
    images = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    return LlavaProcessor(images, tokenizer, patch_size=8, vision_feature_select_strategy="default",
                          num_additional_image_tokens=1, image_token=tokens["image_token"])


_QWEN_VL_PROCESSORS = {"qwen2_vl": "Qwen2VLProcessor", "qwen2_5_vl": "Qwen2_5_VLProcessor", "qwen3_vl": "Qwen3VLProcessor"}
_QWEN_VL_VIDEO = {"qwen2_vl": "Qwen2VLVideoProcessor", "qwen2_5_vl": "Qwen2VLVideoProcessor",
                  "qwen3_vl": "Qwen3VLVideoProcessor"}


def _has_torchvision() -> bool:
    import importlib.util

    return importlib.util.find_spec("torchvision") is not None


def _qwen_vl_processor(tokenizer, model_type: str):
    """Qwen2-VL's (Qwen2.5-VL's, Qwen3-VL's) processor (images of 32x32 to 64x64 pixels, 8x8 patches merged 2x2); its
    video processor needs torchvision: where torchvision is missing, built without it (the class check skipped for
    that absent part), as a user without torchvision has it."""
    from unittest import mock

    import transformers
    from transformers import Qwen2TokenizerFast
    from transformers.processing_utils import ProcessorMixin

    try:
        from transformers import Qwen2VLImageProcessorPil as ImageProcessor  # 5.x without torchvision
    except ImportError:
        from transformers import Qwen2VLImageProcessor as ImageProcessor
    images = ImageProcessor(min_pixels=32 * 32, max_pixels=64 * 64, patch_size=8, merge_size=2, temporal_patch_size=2)
    qwen = Qwen2TokenizerFast(tokenizer_object=tokenizer.backend_tokenizer, pad_token="<pad>", bos_token="<s>",
                              eos_token="</s>", unk_token="<unk>", padding_side="left",
                              extra_special_tokens=tokenizer.extra_special_tokens)
    if _has_torchvision():
        video = getattr(transformers, _QWEN_VL_VIDEO[model_type])(patch_size=8, merge_size=2, temporal_patch_size=2)
        return getattr(transformers, _QWEN_VL_PROCESSORS[model_type])(images, qwen, video)
    check = ProcessorMixin.check_argument_for_proper_class

    def unless_absent(self, name, value):
        return None if value is None else check(self, name, value)

    with mock.patch.object(ProcessorMixin, "check_argument_for_proper_class", unless_absent):
        return getattr(transformers, _QWEN_VL_PROCESSORS[model_type])(images, qwen)


def save_tiny_vlm(model_type: str, path: str | Path, *, seed: int = 0, bare: bool = False, **text_overrides) -> Path:
    """Write a tiny image-text-to-text model (a type of `_VLM`) and its processor to `path` (`bare`: the
    model only, no processor files); `text_overrides` change the text model's config (e.g. `sliding_window=8`)."""
    from transformers import AutoModelForImageTextToText, GenerationConfig

    path = Path(path)
    torch.manual_seed(seed)
    config = tiny_vlm_config(model_type, **text_overrides)
    model = AutoModelForImageTextToText.from_config(config).eval()
    with torch.no_grad():  # Gemma3 starts its projection at zeros: every image would look the same
        projector = getattr(model.model, "multi_modal_projector", None) or torch.nn.Module()  # Qwen2-VL: none
        for weight in projector.parameters():
            if weight.dim() > 1 and not weight.any():
                weight.normal_(std=0.5)
    model.generation_config = GenerationConfig(pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model.save_pretrained(path)
    if not bare:
        processor = _tiny_processor(model_type, config)
        if getattr(processor, "video_processor", ...) is None:  # built without its torchvision part (Qwen2-VL)
            processor.image_processor.save_pretrained(path)
            processor.tokenizer.save_pretrained(path)
        else:
            processor.save_pretrained(path)
    return path


def tiny_vlm_processor(path: str | Path, model_type: str):
    """The processor saved at `path`; where transformers cannot load it without torchvision (Qwen2-VL's declares a
    video processor) or loses its tokenizer's vocabulary, the tiny one built again as `_tiny_processor` builds it."""
    from transformers import AutoConfig, AutoProcessor

    try:
        processor = AutoProcessor.from_pretrained(path)
    except (AttributeError, ImportError, TypeError):
        processor = None
    # transformers 5 reloads the tiny tokenizer under Qwen's tokenizer class without its vocabulary (every text
    # becomes no ids): built again too
    if hasattr(processor, "image_processor") and processor.tokenizer("hello world")["input_ids"]:
        return processor
    return _tiny_processor(model_type, AutoConfig.from_pretrained(path))


# Speech LLMs: the audio tower's config, the processor class and its audio placeholder (a special token of the tiny
# tokenizer; the config's audio token is its id)
_SPEECH_LM = {
    "glmasr": dict(audio=dict(model_type="glmasr_encoder", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, num_mel_bins=16, max_position_embeddings=128),
                   processor="GlmAsrProcessor", token="<|pad|>", text="llama"),
    # a Whisper-style tower: its full window only (2 s: 200 frames, 100 positions)
    "audioflamingo3": dict(audio=dict(model_type="audioflamingo3_encoder", hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4, num_mel_bins=16,
                                      max_source_positions=100),
                           processor="AudioFlamingo3Processor", token="<sound>", text="qwen2"),
    # a tower of windows over packed clips (transformers 5.24): its own extractor (clips padded to whole seconds),
    # the audio start / end tokens its processor reads from the tokenizer, a chat template for its transcription
    # request, the special ids of the tiny vocabulary
    "qwen3_asr": dict(audio=dict(model_type="qwen3_asr_encoder", d_model=32, encoder_ffn_dim=64, encoder_layers=2,
                                 encoder_attention_heads=4, num_mel_bins=16, output_dim=32, downsample_hidden_size=8),
                      processor="Qwen3ASRProcessor", token="<|audio_pad|>", text="qwen3",
                      extractor="Qwen3ASRFeatureExtractor", config=dict(pad_token_id=0, eos_token_id=2, timestamp_token_id=3),
                      tokens={"audio_bos_token": "<|audio_start|>", "audio_eos_token": "<|audio_end|>"},
                      chat_template="{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% for c in m['content'] %}"
                                    "{% if c['type'] == 'audio' %}<|audio_start|><|audio_pad|><|audio_end|>"
                                    "{% else %}{{ c['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endfor %}"
                                    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"),
    # a Whisper-style tower over mistral-common's 30-s chunks (3000 frames of 128 mel bins, 375 audio tokens each;
    # its projector stacks 4 frames: intermediate_size = 4 x hidden_size), a Tekken tokenizer whose [AUDIO] is id 24
    # (the processor's own constant)
    "voxtral": dict(audio=dict(model_type="voxtral_encoder", hidden_size=32, intermediate_size=128, num_hidden_layers=2,
                               num_attention_heads=4, num_mel_bins=128),
                    processor="VoxtralProcessor", token="[AUDIO]", text="llama", tokenizer="tekken", chunk_length=30),
    # a conformer over pairs of 80-bin frames (50 a second), attending within contexts of 20 frames, and a Q-Former
    # projector over windows of 15 (3 rows each); its own extractor (torchaudio), no LoRA adapter (it needs peft)
    "granite_speech": dict(sub_configs=dict(
        encoder_config=dict(model_type="granite_speech_encoder", input_dim=160, num_layers=2, hidden_dim=32,
                            feedforward_mult=2, num_heads=4, output_dim=16, context_size=20, max_pos_emb=64),
        projector_config=dict(model_type="blip_2_qformer", hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                              intermediate_size=64, encoder_hidden_size=32, cross_attention_frequency=1)),
        config=dict(has_lora_adapter=False), processor="GraniteSpeechProcessor", token="<|audio|>", text="granite",
        extractor="GraniteSpeechFeatureExtractor", extractor_args={}),
}
# Granite Speech Plus (transformers 5.24): the same model under its own names
_GRANITE = _SPEECH_LM["granite_speech"]["sub_configs"]
_SPEECH_LM["granite_speech_plus"] = dict(_SPEECH_LM["granite_speech"], sub_configs=dict(
    _GRANITE, encoder_config=dict(_GRANITE["encoder_config"], model_type="granite_speech_plus_encoder")))

# Tekken's control tokens by rank (mistral-common's order; the rest of the ranks are fillers)
_TEKKEN_SPECIALS = dict(enumerate(
    ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]",
     "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]", "<pad>", "[IMG_BREAK]", "[IMG_END]", "[PREFIX]", "[MIDDLE]", "[SUFFIX]",
     "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[TOOL_CONTENT]"]))
_TEKKEN_SPECIALS.update({24: "[AUDIO]", 25: "[BEGIN_AUDIO]", 32: "[ARGS]", 33: "[CALL_ID]", 34: "[TRANSCRIBE]"})


def tiny_tekken(specials: int = 40):
    """A mistral-common Tekken tokenizer (transformers' MistralCommonBackend): the 256 bytes, `specials` control
    tokens, and Voxtral's audio section (16 kHz, 12.5 audio tokens a second, 128 mel bins, 30-s chunks)."""
    import base64
    import json
    import tempfile

    import transformers

    tekken = {
        "config": {"pattern": r"\s*[\r\n]+|\s+(?!\S)|\s+|[^\s]+", "num_vocab_tokens": 256, "version": "v7",
                   "default_vocab_size": 256 + specials, "default_num_special_tokens": specials},
        "vocab": [{"rank": i, "token_bytes": base64.b64encode(bytes([i])).decode(), "token_str": None} for i in range(256)],
        "special_tokens": [{"rank": i, "token_str": _TEKKEN_SPECIALS.get(i, f"<SPECIAL_{i}>"), "is_control": True}
                           for i in range(specials)],
        "version": 1, "type": "Tekken",
        "audio": {"sampling_rate": 16000, "frame_rate": 12.5, "chunk_length_s": 30.0,
                  "audio_encoding_config": {"num_mel_bins": 128, "hop_length": 160, "window_size": 400}},
    }
    source = Path(tempfile.mkdtemp()) / "tekken.json"  # saved apart: transformers 4 cannot save a tokenizer over its file
    source.write_text(json.dumps(tekken))
    backend = getattr(transformers, "MistralCommonBackend", None) or transformers.MistralCommonTokenizer
    return backend.from_pretrained(str(source.parent))


def save_tiny_speech_lm(model_type: str, path: str | Path, *, seed: int = 0, bare: bool = False) -> Path:
    """Write a tiny speech LLM (a type of `_SPEECH_LM`: an audio tower feeding a llama) and its processor (Whisper's
    feature extractor, 16 mel bins, clips up to 2 s, unless its spec says otherwise) to `path` (`bare`: the model
    only)."""
    import transformers
    from transformers import AutoConfig, AutoModelForSeq2SeqLM, GenerationConfig, WhisperFeatureExtractor

    path, spec = Path(path), _SPEECH_LM[model_type]
    if spec.get("tokenizer") == "tekken":
        tokenizer = tiny_tekken()
    else:
        tokenizer = tiny_tokenizer(_DECODER["vocab_size"], extra={"audio_token": spec["token"], **spec.get("tokens", {})})
    text = dict(_DECODER, model_type=spec["text"], vocab_size=max(_DECODER["vocab_size"], len(tokenizer)),
                pad_token_id=0, bos_token_id=1, eos_token_id=2)
    sub_configs = spec.get("sub_configs", {"audio_config": spec.get("audio")})
    config = AutoConfig.for_model(model_type, text_config=text, **sub_configs, **spec.get("config", {}),
                                  audio_token_id=tokenizer.convert_tokens_to_ids(spec["token"]))
    torch.manual_seed(seed)
    model = AutoModelForSeq2SeqLM.from_config(config).eval()
    model.generation_config = GenerationConfig(pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model.save_pretrained(path)
    if not bare:
        extractor_class = getattr(transformers, spec.get("extractor", "WhisperFeatureExtractor"))
        chunks = {"chunk_length": spec.get("chunk_length", 2)} if extractor_class is WhisperFeatureExtractor else {}
        sizes = spec.get("extractor_args", {"feature_size": spec.get("audio", {}).get("num_mel_bins")})
        extractor = extractor_class(**sizes, **chunks)
        template = {"chat_template": spec["chat_template"]} if "chat_template" in spec else {}
        getattr(transformers, spec["processor"])(extractor, tokenizer, **template).save_pretrained(path)
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


def save_tiny_timm(name: str, path: str | Path, *, seed: int = 0, safetensors: bool = True) -> Path:
    """One of timm's own test models (`timm.list_models("test_*")`: its tiny architectures, random weights, 5
    classes) as timm saves a model for the hub: config.json with its `pretrained_cfg`, and its weights."""
    import timm
    from timm.models import save_for_hf

    torch.manual_seed(seed)
    save_for_hf(timm.create_model(name, pretrained=False, num_classes=5).eval(), path, safe_serialization=safetensors)
    return Path(path)


def cache_snapshot(cache_dir: str | Path, repo: str, files) -> Path:
    """`files` as the hub cache under `cache_dir` holds a download of `repo` (one snapshot, `refs/main`): what
    `HF_HUB_OFFLINE=1` resolves `repo` to, as it resolves a hub id a user downloaded before."""
    import shutil

    root = Path(cache_dir) / f"models--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text("0" * 40)
    snapshot = root / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    for file in files:
        shutil.copy(file, snapshot / Path(file).name)
    return snapshot
