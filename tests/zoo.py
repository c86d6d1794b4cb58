"""The zoo: every model type of one of transformers' own auto mappings (causal LM, seq2seq, speech
seq2seq), made tiny from its config class, kept where PyTorch itself can `generate` with it, exported by the
real `optimum-cli export onnx --dynamo` and run through optimum's runtime class against PyTorch (a batch of 2,
text rows left-padded: greedy tokens identical, logits within 1e-4 on real positions).
Every step runs in a child process; one row per model type.

    python tests/zoo.py --json t5.json [--kind causal|seq2seq|speech|vlm] [--only TYPE ...] [--unlisted] [--merge]
    python tests/zoo.py --table t4.json t5.json [--docs docs/status.md]      # the tables (into the docs' zoo section)

With `--docs`, the sections of mappings without results in the files given stay as the page has them.

`--kind vlm` (image-text-to-text) also builds a tiny processor and records the stage a row fails at.
`make zoo` runs both environments and rewrites the zoo section of docs/status.md.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

HERE = Path(__file__).resolve().parent
ATOL = 1e-4
NEW_TOKENS = 8
EXPORT_TIMEOUT = 600  # s; the table reports the wall time of every export
PROMPTS = ["hello world", "the quick brown fox jumps over the lazy dog"]
BEGIN, END = "<!-- zoo:begin -->", "<!-- zoo:end -->"  # docs/status.md's generated section



@dataclass(frozen=True)
class Kind:
    mapping: str  # transformers.models.auto.modeling_auto.<mapping>
    task: str
    auto: str  # the PyTorch auto class
    runtime: str  # optimum's runtime class
    title: str


KINDS = {
    "causal": Kind("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "text-generation-with-past", "AutoModelForCausalLM",
                   "ORTModelForCausalLM", "Causal LM"),
    "seq2seq": Kind("MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "text2text-generation-with-past",
                    "AutoModelForSeq2SeqLM", "ORTModelForSeq2SeqLM", "Seq2seq LM"),
    "speech": Kind("MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES", "automatic-speech-recognition-with-past",
                   "AutoModelForSpeechSeq2Seq", "ORTModelForSpeechSeq2Seq", "Speech seq2seq"),
    "vlm": Kind("MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES", "image-text-to-text", "AutoModelForImageTextToText",
                "ORTModelForImageTextToText", "Image-text-to-text"),
}

# Generic shrinking: each attribute the model type's default config has is set to a tiny value (through its
# constructor, so derived fields such as per-layer type lists follow). Names differ between families.
TINY = dict(
    vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=8, max_position_embeddings=128, n_embd=32, n_layer=2, n_head=4, n_positions=128,
    n_ctx=128, n_inner=64, d_model=32, n_heads=4, n_layers=2, num_layers=2, ffn_dim=64, ffn_hidden_size=64,
    attention_heads=4, num_heads=4, d_ff=64, moe_intermediate_size=32, shared_expert_intermediate_size=32,
    num_experts=4, num_local_experts=4, n_routed_experts=4, num_experts_per_tok=2, moe_topk=2, top_k=2,
    kv_lora_rank=16, q_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8,
    state_size=8, mamba_d_state=8, ssm_state_size=8, conv_kernel=4, mamba_d_conv=4, time_step_rank=4,
    mamba_dt_rank=4, expand=2, mamba_expand=2, mamba_n_heads=4, n_mamba_heads=2, linear_num_value_heads=4, linear_num_key_heads=2,
    linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=4, block_ff_dim=64,
    sliding_window=64, attention_window_size=64, max_seq_len=128, seq_length=128,
    use_mambapy=False, use_mamba_kernels=False,
    encoder_layers=2, decoder_layers=2, num_decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
    encoder_ffn_dim=64, decoder_ffn_dim=64, d_kv=8, num_mel_bins=16, max_source_positions=32,
    max_target_positions=64, vocab_size_per_layer_input=128, hidden_size_per_layer_input=8,
)
# Per model type, only where the generic shrink cannot work, each with its reason.
OVERRIDES: dict[str, tuple[dict, str]] = {
    "gptj": ({"rotary_dim": 4}, "its rotary_dim (64) is wider than the tiny head (8)"),
    "codegen": ({"rotary_dim": 4}, "its rotary_dim (64) is wider than the tiny head (8)"),
    "gpt_neo": ({"attention_types": [[["global", "local"], 1]]}, "its attention_types list one kind per layer of 24"),
    "bamba": ({"attn_layer_indices": [1]}, "its default attention layers lie beyond 2 layers; the hybrid cache needs one"),
    "mamba2": ({"head_dim": 16, "n_groups": 1}, "num_heads * head_dim must equal expand * hidden_size; "
               "num_heads a multiple of n_groups"),
    "zamba": ({"num_hidden_layers": 5, "attn_layer_period": 2, "attn_layer_offset": 1},
              "its shared attention block is tied across hybrid layers: the pattern needs two"),
    "kosmos-2": ({"text_config": dict(vocab_size=128, embed_dim=32, layers=2, attention_heads=4, ffn_dim=64,
                                      max_position_embeddings=128)},
                 "its text config names its width and depth embed_dim and layers, which the shrink does not know"),
}


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("torch", "transformers", "optimum", "optimum-onnx", "onnxruntime"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def population(kind: str = "causal") -> list[str]:
    from transformers.models.auto import modeling_auto

    return sorted(getattr(modeling_auto, KINDS[kind].mapping))


def listed(kind: str = "causal") -> set[str]:
    """The model types the suite names for this kind (checked on every run of it)."""
    import ast

    source, lists = {"causal": ("test_decoder_sweep.py", ("COMMON", "T5_ONLY", "RECURRENT")),
                     "seq2seq": ("test_seq2seq_cli.py", ("MODELS",)), "speech": ("test_seq2seq_cli.py", ()),
                     "vlm": ("test_vlm_runtime.py", ())}[kind]
    tree = ast.parse((HERE / source).read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) in lists:
            names |= {c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant) and isinstance(c.value, str)
                      and c.value not in ("common", "t5")}
    return names


def _layer_kinds(default, own, layers: int) -> dict:
    """Keep every kind of layer of a hybrid in the shrunk model: the first `layers` layers of its pattern
    may all be of one kind (no attention layer: the model cannot run). A per-layer list of the default
    config (layer_types, layers_block_type, ...) becomes its kinds in order of appearance, with
    num_hidden_layers to match; a `<kind>_period` / `<kind>_offset` pair becomes 2 / 1."""
    found = {}
    total = getattr(default, "num_hidden_layers", None)
    for key, value in vars(default).items():
        if (key in own and isinstance(value, (list, tuple)) and total and len(value) == total
                and all(isinstance(v, str) for v in value) and len(set(value)) > 1):
            found[key] = list(dict.fromkeys(value))
    lengths = {len(kinds) for kinds in found.values()}
    extra = dict(found, num_hidden_layers=max(lengths.pop(), layers)) if len(lengths) == 1 else {}
    for key in own:
        if key.endswith("_period") and key.replace("_period", "_offset") in own:
            offset = getattr(default, key.replace("_period", "_offset"), None)
            if isinstance(offset, int) and offset >= layers:
                extra.update({key: 2, key.replace("_period", "_offset"): 1})
    return extra


def _shrunk(default, layers_from_overrides: bool, tiny: dict = TINY) -> dict:
    own = inspect.signature(type(default).__init__).parameters  # not the generation defaults of old configs (top_k)
    kwargs = {k: v for k, v in tiny.items() if k in own}
    if not layers_from_overrides:  # an override that sets the depth sets the pattern too
        kwargs.update(_layer_kinds(default, own, kwargs.get("num_hidden_layers", 2)))
    return kwargs


def _shrunk_sub_config(sub, tiny: dict = TINY, stages: bool = False) -> dict | None:
    """A composite model's sub-config (text, vision, audio) shrunk the same way, its own sub-configs too (PI0's
    vlm_config, DeepSeek-OCR2's sam_config), as the dict its parent's constructor takes (per-layer lists of the
    default depth left for the constructor to derive); where its class validates the result, once more made to
    agree (`_agreeing`); None where its class takes no such dict (dbrx's sub-configs refuse their own
    serialized keys): left as it is."""
    from transformers import PretrainedConfig

    depth = getattr(sub, "num_hidden_layers", None)
    kept = {k: v for k, v in sub.to_dict().items() if not (isinstance(v, list) and depth and len(v) == depth)}
    kept.pop("per_layer_config", None)  # per-layer overrides of the default depth (gemma4, 5.24): derived again
    for name in getattr(sub, "sub_configs", {}):  # an instance property on some configs of 4.57 (detr)
        if isinstance(getattr(sub, name, None), PretrainedConfig):
            kept[name] = _shrunk_sub_config(getattr(sub, name), tiny, stages) or kept.get(name)
    kwargs = {**kept, **_shrunk(sub, False, tiny)}
    if stages:
        kwargs = _agreeing(kwargs, kept, heads=False)
    try:
        shrunk = type(sub)(**kwargs)
    except Exception:
        try:
            shrunk = type(sub)(**_agreeing(kwargs, kept))
        except Exception:
            return None
    if hasattr(shrunk, "vocab_size"):
        _small_token_ids(shrunk)
    return shrunk.to_dict()


def _agreeing(kwargs: dict, default: dict, heads: bool = True) -> dict:
    """Shrunk values made to agree where a config validates them: a list where the default is one (per-expert
    sizes), as many key/value heads as heads, multimodal rotary sections summing to half a head."""
    kwargs = dict(kwargs)
    for key, value in kwargs.items():
        if isinstance(value, int) and isinstance(default.get(key), list) and default[key]:
            kwargs[key] = [value] * len(default[key])
    if heads and "num_key_value_heads" in kwargs and "num_attention_heads" in kwargs:
        kwargs["num_key_value_heads"] = kwargs["num_attention_heads"]
    rope, head = kwargs.get("rope_parameters"), kwargs.get("head_dim")
    if isinstance(rope, dict) and isinstance(rope.get("mrope_section"), list) and isinstance(head, int):
        sections = len(rope["mrope_section"])
        kwargs["rope_parameters"] = dict(rope, mrope_section=[head // 2 - (sections - 1)] + [1] * (sections - 1))
    return kwargs


def tiny_config(model_type: str, tiny: dict = TINY, stages: bool = False):
    """The model type's default config, shrunk generically, its sub-configs too. `stages` (vision and audio
    backbones): a size the default gives per stage stays a list of that many stages, and a timm backbone (built
    by name at full size) becomes the transformers one of the config (shrunk like the rest)."""
    from transformers import AutoConfig, PretrainedConfig

    default = AutoConfig.for_model(model_type)
    extra, _ = OVERRIDES.get(model_type, ({}, ""))
    kwargs = _shrunk(default, "num_hidden_layers" in extra, tiny)
    if stages:
        kwargs = _agreeing(kwargs, default.to_dict(), heads=False)
        if getattr(default, "use_timm_backbone", False):
            kwargs.update(use_timm_backbone=False, backbone=None, use_pretrained_backbone=False)
    for name in getattr(default, "sub_configs", {}):  # an instance property on some configs of 4.57 (detr)
        if isinstance(getattr(default, name, None), PretrainedConfig) and name not in extra:
            if (sub := _shrunk_sub_config(getattr(default, name), tiny, stages)) is not None:
                kwargs[name] = sub
    config = AutoConfig.for_model(model_type, **{**kwargs, **extra})
    backbone = getattr(config, "backbone_config", None)
    if stages and getattr(backbone, "model_type", None) == "timm_backbone":  # transformers' own of that name
        backbone = AutoConfig.for_model(backbone.backbone.rstrip("0123456789"), out_indices=backbone.out_indices)
        kwargs.pop("backbone_config", None)
    if stages and isinstance(backbone, PretrainedConfig) and "backbone_config" not in kwargs:  # made by the config
        config = AutoConfig.for_model(model_type, **{**kwargs, **extra, "backbone": None,
                                                     "backbone_config": _shrunk_sub_config(backbone, tiny, True)})
    for part in config_parts(config):  # a sub-config's key/value heads its constructor derives, not takes
        kv, heads = getattr(part, "num_key_value_heads", None), getattr(part, "num_attention_heads", None)
        if isinstance(kv, int) and isinstance(heads, int) and kv > heads > 0:  # (parakeet's: its default's 8)
            part.num_key_value_heads = heads
    _small_token_ids(config)
    return config


def _small_token_ids(config) -> None:
    """Token ids of the full vocabulary brought into the tiny one: pad / bos / eos = 0 / 1 / 2 (a decoder's
    start = bos), any other (image, separator, mask...) to distinct ids from the top, which the prompts
    do not use."""
    config.pad_token_id, config.bos_token_id, config.eos_token_id = 0, 1, 2
    top = TINY["vocab_size"] - 1
    for name, value in sorted(vars(config).items()):  # stored values: a per-layer size raises when read (gemma4)
        if name in ("decoder_start_token_id", "decoder_bos_token_id") and isinstance(value, int):
            setattr(config, name, 1)
        elif (name.endswith(("_token_id", "_token_index")) and isinstance(value, int)
              and value >= TINY["vocab_size"]):
            setattr(config, name, top)
            top -= 1


def one_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0][:200] if lines else ''}"


def _inputs(kind: str, model, config, tokenizer) -> dict:
    """A batch of 2: text rows left-padded; speech without a feature extractor as two waveforms (a raw-waveform
    encoder) or log-mel-like features (2 x max_source_positions frames, the shape the export synthesizes when a
    checkpoint has no feature extractor)."""
    import torch

    if kind != "speech":
        batch = tokenizer(PROMPTS, return_tensors="pt", padding=True)
        return {k: batch[k] for k in ("input_ids", "attention_mask")}
    if model.main_input_name == "input_values":
        return {"input_values": torch.randn(2, 6000, generator=torch.Generator().manual_seed(0)) * 0.3}
    bins = getattr(config, "num_mel_bins", None) or getattr(config, "input_feat_per_channel", 16)
    frames = 2 * (getattr(config, "max_source_positions", None) or 32)
    return {"input_features": torch.randn(2, bins, frames, generator=torch.Generator().manual_seed(0)).clamp(-1, 1)}


def _greedy_and_logits(kind: str, model, inputs: dict):
    """Greedy tokens, and the logits of one forward pass: of the prompt (causal), of every generated position
    (encoder-decoder: decoder_input_ids = the greedy tokens). No return_dict_in_generate: Whisper's generate on
    transformers 5 then needs an EncoderDecoderCache, which optimum-onnx 0.1.0's runtime does not return."""
    tokens = model.generate(**inputs, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                            pad_token_id=0)
    extra = {} if kind == "causal" else {"decoder_input_ids": tokens}
    return tokens, model(**inputs, **extra).logits


def _each_row_alone(kind: str, model, inputs: dict):
    """A causal LM's new greedy tokens of each row of the batch generated alone (a batch of one, its padding and
    mask kept): the reference where PyTorch's own batched generate mixes rows (transformers' RWKV one-token step
    broadcasts the batch against itself)."""
    import torch

    if kind != "causal":
        return None
    rows = zip(inputs["input_ids"].split(1), inputs["attention_mask"].split(1))
    return torch.cat([model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW_TOKENS,
                                     min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)[:, ids.shape[1]:]
                      for ids, mask in rows])


def _draw_zero_linears(model, config) -> None:
    """Draw the weights of linear layers the model's init leaves all zero (afmoe's router): with equal scores
    for every expert, routing follows each runtime's tie-breaking (torch.topk and onnxruntime's TopK pick
    different experts), not the model. Drawn like the others: normal(0, initializer_range), seeded."""
    import torch

    generator = torch.Generator().manual_seed(0)
    std = getattr(config, "initializer_range", None) or 0.02
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear) and not module.weight.any():
                module.weight.copy_(torch.randn(module.weight.shape, generator=generator) * std)


def config_parts(config) -> list:
    """The config and its sub-configs (a CTC head's encoder_config)."""
    from transformers import PretrainedConfig

    return [config] + [v for v in vars(config).values() if isinstance(v, PretrainedConfig)]


def feature_extractor(model_type: str, model, config):
    """The speech feature extractor a checkpoint ships, sized to the config's mel bins; None for raw-waveform
    models of Wav2Vec2's default extractor (the export's default without one)."""
    import inspect

    import transformers
    from transformers.models.auto.feature_extraction_auto import FEATURE_EXTRACTOR_MAPPING_NAMES

    name, kwargs, _ = EXTRACTORS.get(model_type, (FEATURE_EXTRACTOR_MAPPING_NAMES.get(model_type), None, ""))
    if name is None or (name == "Wav2Vec2FeatureExtractor" and kwargs is None):
        return None
    cls = getattr(transformers, name)
    bins = next((getattr(c, "num_mel_bins") for c in config_parts(config) if isinstance(getattr(c, "num_mel_bins", None), int)),
                None)
    takes = inspect.signature(cls.__init__).parameters
    return cls(**kwargs or {}, **{k: bins for k in ("feature_size", "num_mel_bins") if k in takes and bins},
               **({"max_length": config.max_length} if "max_length" in takes and hasattr(config, "max_length") else {}))


def speech_inputs(model, extractor) -> dict:
    """Two clips (0.5 s and 0.3 s) through the extractor, with the mask it gives where the model takes it."""
    import inspect

    import numpy as np

    rate = extractor.sampling_rate
    t = np.arange(rate // 2) / rate
    waves = [(0.3 * np.sin(2 * np.pi * (220 + 110 * i) * t)).astype(np.float32)[: rate * (5 - 2 * i) // 10]
             for i in range(2)]
    try:  # its own padding, as the pipeline calls it (whisper's: to 30 s)
        features = extractor(waves, sampling_rate=rate, return_tensors="pt")
    except ValueError:  # an extractor that pads nothing by default
        features = extractor(waves, sampling_rate=rate, return_tensors="pt", padding=True)
    takes = inspect.signature(model.forward).parameters
    return {k: v for k, v in features.items() if k in takes}


def step_build(kind: str, model_type: str, directory: Path) -> dict:
    """Child: the tiny checkpoint, and PyTorch's own greedy run (the population test) as the reference."""
    import torch
    import transformers
    from transformers import GenerationConfig

    sys.path.insert(0, str(HERE))
    from tiny import tiny_tokenizer

    def build(config):
        torch.manual_seed(0)
        model = getattr(transformers, KINDS[kind].auto).from_config(config).eval()
        _draw_zero_linears(model, config)
        start = getattr(config, "decoder_start_token_id", None)
        model.generation_config = GenerationConfig(pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                                   decoder_start_token_id=1 if start is None else start)
        extractor = feature_extractor(model_type, model, config) if kind == "speech" else None
        inputs = speech_inputs(model, extractor) if extractor else _inputs(kind, model, config, tokenizer)
        with torch.no_grad():
            return (model, extractor, inputs, *_greedy_and_logits(kind, model, inputs),
                    _each_row_alone(kind, model, inputs))

    tokenizer = tiny_tokenizer(TINY["vocab_size"])
    try:
        speech = kind == "speech"  # the waveform models' two-convolution feature encoder, sized mel bins
        model, extractor, inputs, tokens, logits, rows = build(tiny_config(model_type, TINY_AUDIO if speech else TINY,
                                                                           stages=speech))
        model.save_pretrained(directory / "checkpoint")
        for files in (tokenizer, extractor):
            if files is not None:
                files.save_pretrained(directory / "checkpoint")
    except Exception as e:  # PyTorch cannot run it: outside the population
        return {"viable": False, "reason": one_line(e)}
    torch.save({"inputs": inputs, "logits": logits, "tokens": tokens, "rows": rows}, directory / "reference.pt")
    return {"viable": True}


def step_check(kind: str, directory: Path) -> dict:
    """Child: the export through optimum's runtime class against the reference: greedy tokens, then the
    logits on real positions (the prompt's for a causal LM, the generated ones for an encoder-decoder)."""
    import optimum.onnxruntime
    import torch

    reference = torch.load(directory / "reference.pt")
    inputs = reference["inputs"]
    try:
        model = getattr(optimum.onnxruntime, KINDS[kind].runtime).from_pretrained(directory / "onnx")
        tokens, logits = _greedy_and_logits(kind, model, inputs)
        keep = inputs["attention_mask"].bool() if kind == "causal" else slice(None)
        diff = (logits[keep] - reference["logits"][keep]).abs().max().item()
    except Exception as e:
        return {"ok": False, "reason": f"runtime: {one_line(e)}"}
    note = ""
    if not torch.equal(tokens, reference["tokens"]):
        rows = reference.get("rows")
        if rows is None or not torch.equal(tokens[:, -NEW_TOKENS:], rows):
            return {"ok": False, "reason": f"greedy tokens differ (logits within {diff:.1e})", "max_abs": diff}
        note = "PyTorch's batched generate differs; tokens equal each row generated alone"
    if not diff < ATOL:
        return {"ok": False, "reason": f"logits differ by {diff:.1e}", "max_abs": diff}
    return {"ok": True, "max_abs": diff, "note": note}


def child(*args: str, timeout: int = 900, script: str = __file__, **options) -> dict:
    """`script ARGS` in a child process: the JSON of its last line, or why it failed."""
    run = subprocess.run([sys.executable, script, *args], capture_output=True, text=True, timeout=timeout,
                         **options)
    lines = run.stdout.strip().splitlines()
    if run.returncode != 0 or not lines:
        lines = [line for line in run.stderr.strip().splitlines() if line.strip()]
        errors = [line for line in lines if "Error" in line]
        reason = errors[-1][:200] if errors else f"exit status {run.returncode}, no error line"
        return {"viable": False, "ok": False, "reason": f"child failed: {reason}"}
    return json.loads(lines[-1])


def cli_error(stderr: str) -> str:
    errors = [line for line in stderr.splitlines() if ": error: " in line]
    if errors:
        return errors[-1].split(": error: ", 1)[1][:300]
    tail = [line for line in stderr.splitlines() if line.strip()]
    return (tail[-1] if tail else "no output")[:300]


def cli_export(directory: Path, task: str) -> dict:
    """The real `optimum-cli export onnx --dynamo` of DIRECTORY/checkpoint into DIRECTORY/onnx: its wall time, then
    the outcome where it failed, else which exporter wrote it (dynamo, or the torchscript fallback and why)."""
    cli = Path(sys.executable).parent / "optimum-cli"
    start = time.perf_counter()
    try:
        export = subprocess.run([str(cli), "export", "onnx", "--dynamo", "--model", str(directory / "checkpoint"),
                                 "--task", task, str(directory / "onnx")], capture_output=True, text=True,
                                timeout=EXPORT_TIMEOUT)
    except subprocess.TimeoutExpired:
        return {"outcome": "fail", "reason": f"export over {EXPORT_TIMEOUT} s", "export_s": EXPORT_TIMEOUT}
    seconds = round(time.perf_counter() - start, 1)
    if export.returncode != 0:
        return {"export_s": seconds, "outcome": "refused", "reason": cli_error(export.stderr)}
    manifest = json.loads((directory / "onnx" / "optimum_dynamo.json").read_text())
    if manifest["exporter"] == "torchscript-fallback":
        return {"export_s": seconds, "exporter": "fallback", "fallback_reason": manifest.get("fallback_reason", "")}
    return {"export_s": seconds, "exporter": "dynamo"}


def run_one(model_type: str, root: Path, kind: str = "causal") -> dict:
    """One row: viable?, then the export's outcome (dynamo / fallback / refused / fail) and its wall time."""
    directory = root / model_type
    directory.mkdir(parents=True, exist_ok=True)
    if kind == "vlm":
        return run_vlm_one(model_type, directory)
    row = {"model_type": model_type, **child("--step", "build", kind, model_type, str(directory))}
    if not row["viable"]:
        return row
    row.update(cli_export(directory, KINDS[kind].task))
    if "outcome" in row:
        return row
    check = child("--step", "check", kind, str(directory))
    exporter = row.pop("exporter")
    row.update(outcome=exporter if check["ok"] else "fail", reason=check.get("reason", ""),
               max_abs=check.get("max_abs"), **({"note": check["note"]} if check.get("note") else {}))
    return row


# Image-text-to-text: the vision sizes the generic shrink adds (a 32x32 image in 8x8 patches; Gemma3-style
# pooling to 4 tokens), and the processor built generically around the tiny tokenizer.
TINY_VISION = dict(TINY, image_size=32, patch_size=8, mm_tokens_per_image=4, projection_dim=32)
IMAGE_SIDE = 32
ROW_TIMEOUT = 300  # s, each child (build, export, check) of an image-text-to-text row
ROW_MEMORY = 16 << 30  # bytes of address space for each child (torch 2.15's CUDA build maps more than 8 GB: qwen2_vl)
# A processor argument named differently from the config attribute that holds its value.
PROCESSOR_ALIASES = {"image_seq_length": ("mm_tokens_per_image", "image_seq_length", "num_image_tokens"),
                     "img_size": ("image_size",)}

# Speech: the waveform models' feature encoder: two convolutions (a 6000-sample clip is 149 frames) instead of seven
# of 512 channels; a list where the generic shrink has a number (a state-space model's conv_kernel)
TINY_AUDIO = dict(TINY_VISION, conv_dim=[32, 32], conv_stride=[5, 4], conv_kernel=[10, 8],
                  num_feat_extract_layers=2, num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
                  tdnn_dim=[32, 32], tdnn_kernel=[3, 1], tdnn_dilation=[1, 1], xvector_output_dim=16,
                  max_source_positions=1500)

# The feature extractor a checkpoint ships where transformers' mapping names another or the default differs (one
# giving no input the model takes, or no mask): its class, its arguments and the reason.
EXTRACTORS = {
    "wav2vec2-bert": ("SeamlessM4TFeatureExtractor", {}, "its checkpoints ship SeamlessM4T's log-mel extractor; the "
                      "mapping names Wav2Vec2's raw-waveform one"),
    "moonshine": ("Wav2Vec2FeatureExtractor", {"return_attention_mask": True, "do_normalize": False},
                  "its checkpoints' extractor gives the mask, which optimum's Moonshine encoder requires"),
}


class Stage(Exception):
    """A row's failure at one stage (config, processor, pytorch generate, export, parity)."""

    def __init__(self, stage: str, reason: str):
        super().__init__(reason)
        self.stage, self.reason = stage, reason


def _configs(config) -> list:
    """The config and its sub-configs (text, vision, ...)."""
    from transformers import PretrainedConfig

    subs = [getattr(config, name, None) for name in getattr(config, "sub_configs", {})]
    return [config, *(sub for sub in subs if isinstance(sub, PretrainedConfig))]


def _config_value(config, name: str):
    """`name` on the config or the first sub-config that has it (vision sizes live in vision_config)."""
    for part in _configs(config):
        if getattr(part, name, None) is not None and not isinstance(getattr(part, name), dict):
            return getattr(part, name)
    return None


def _class(kind: str, name: str):
    from transformers.models.auto import image_processing_auto, processing_auto

    find = {"processor": processing_auto.processor_class_from_name,
            "image": image_processing_auto.get_image_processor_class_from_name}[kind]
    try:
        found = find(name)
    except ImportError as e:  # torchvision-only image processors
        raise Stage("processor", f"{name}: {one_line(e)}") from e
    if found is None:
        raise Stage("processor", f"{name} not found (a library it needs is not installed?)")
    return found


def _image_processor(model_type: str, config, extra: dict):
    """The image processor class of the model type (the PIL / slow one: torchvision may be missing), made for
    IMAGE_SIDE images: every side of its size and crop size set to it (an area where the value is one, Qwen2-VL's
    pixel bounds), and its arguments named like a vision config attribute (patch_size, merge_size ...) from it;
    `extra` where it takes them (PaliGemma's processor reads the image processor's image_seq_length)."""
    from transformers.models.auto import image_processing_auto

    names = image_processing_auto.IMAGE_PROCESSOR_MAPPING_NAMES.get(model_type)
    if isinstance(names, dict):  # transformers 5: per backend
        names = [names.get("pil"), names.get("torchvision")]
    names = [n for n in (names or ()) if n]
    if not names:
        raise Stage("processor", "no image processor class in IMAGE_PROCESSOR_MAPPING_NAMES")
    cls = _class("image", names[0])
    default = cls()
    kwargs = {}
    for key, value in vars(default).items():  # every size (DeepSeek-VL-Hybrid's high_res_size), not a patch size
        if not key.endswith("size") or isinstance(_config_value(config, key), int):
            continue
        side = {k: (IMAGE_SIDE * IMAGE_SIDE if v > 2048 else IMAGE_SIDE) for k, v in _sides(value).items()
                if "pixels" not in k}
        if side:
            kwargs[key] = side
    for name in ("min_pixels", "max_pixels"):
        if getattr(default, name, None):
            kwargs[name] = IMAGE_SIDE * IMAGE_SIDE
    for name, value in vars(default).items():
        if _pixel_pairs(value) and isinstance(_config_value(config, name), list):  # LLaVA-Next's grid pinpoints
            kwargs[name] = _config_value(config, name)
        if set(_sides(value)) == {"height", "width"} and name not in kwargs:  # Fuyu's patch_size
            side = _config_value(config, name)
            if isinstance(side, int):
                kwargs[name] = {"height": side, "width": side}
        if isinstance(value, int) and not isinstance(value, bool) and name not in kwargs:
            for part in _configs(config)[1:]:
                match = [v for k, v in vars(part).items() if (k == name or k.endswith(f"_{name}")) and isinstance(v, int)]
                if match:
                    kwargs[name] = match[0]
                    break
    try:
        return cls(**kwargs, **extra)
    except TypeError:
        return cls(**kwargs)


def _video_processor(model_type: str):
    """The model type's video processor with its defaults (a processor taking one needs it to load; the zoo's prompts
    are images): transformers' video processors need torchvision."""
    from transformers.models.auto import video_processing_auto

    names = video_processing_auto.VIDEO_PROCESSOR_MAPPING_NAMES.get(model_type)
    names = [n for n in ((names.values() if isinstance(names, dict) else [names]) if names else ()) if n]
    if not names:
        raise Stage("processor", "the processor takes a video processor; none in VIDEO_PROCESSOR_MAPPING_NAMES")
    try:
        return video_processing_auto.video_processor_class_from_name(names[0])()
    except (ImportError, TypeError) as e:
        raise Stage("processor", f"{names[0]}: {one_line(e)}") from e


def _sides(value) -> dict:
    """The int entries of a size (a dict or transformers 5's SizeDict)."""
    items = value.items() if isinstance(value, dict) else vars(value).items() if type(value).__name__ == "SizeDict" else ()
    return {k: v for k, v in items if isinstance(v, int) and not isinstance(v, bool)}


def _pixel_pairs(value) -> bool:
    return (isinstance(value, (list, tuple)) and len(value) > 0
            and all(isinstance(v, (list, tuple)) and len(v) == 2 and all(isinstance(x, int) for x in v) for v in value))


def _scaled_pixel_pairs(model_type: str, config) -> None:
    """Lists of (height, width) pixel pairs of the config (LLaVA-Next's image_grid_pinpoints, multiples of the
    default image size) scaled to the tiny image size: else the processor tiles images for the default size."""
    from transformers import AutoConfig

    default = _config_value(AutoConfig.for_model(model_type), "image_size")
    side = _config_value(config, "image_size")
    if not isinstance(default, int) or not isinstance(side, int) or default == side:
        return
    for part in _configs(config):
        for name, value in list(vars(part).items()):
            if _pixel_pairs(value) and all(x % default == 0 for pair in value for x in pair):
                setattr(part, name, [[x * side // default for x in pair] for pair in value])


def _within_shrunk_sizes(config) -> None:
    """Values the shrink does not know, left at the default model's, brought within the shrunk sizes: a head
    wider than the hidden size (Pixtral's head_dim) becomes hidden / heads; layer indexes past the depth
    (SAM's global_attn_indexes) are scaled onto it, vision feature layers past the tower's clamped to it."""
    for part in _configs(config):
        hidden, heads, depth, head = (vars(part).get(n) for n in ("hidden_size", "num_attention_heads", "num_hidden_layers",
                                                                  "head_dim"))
        if isinstance(head, int) and isinstance(hidden, int) and isinstance(heads, int):
            if head > hidden:
                part.head_dim = hidden // heads
        for name, value in list(vars(part).items()):
            if (isinstance(depth, int) and name.endswith(("_indexes", "_indices")) and isinstance(value, list) and value
                    and all(isinstance(i, int) for i in value) and max(value) >= depth):
                setattr(part, name, sorted({i * depth // (max(value) + 1) for i in value}))
    depth = getattr(getattr(config, "vision_config", None), "num_hidden_layers", None)
    for name in ("vision_feature_layer", "vision_feature_layers"):  # VipLLaVA's list of tower layers (4.57: plural)
        layers = vars(config).get(name)
        if isinstance(depth, int) and isinstance(layers, (list, tuple)) and any(not -depth - 1 <= i <= depth for i in layers):
            setattr(config, name, [min(max(i, -depth - 1), depth) for i in layers])  # as many: the projector's width
    text, vision = config.get_text_config(), getattr(config, "vision_config", None)
    if vision is not None and text is not config and isinstance(vars(vision).get("out_hidden_size"), int):
        vision.out_hidden_size = text.hidden_size  # Qwen2.5-VL's merger writes rows of the text's width
    for part in _configs(config):
        _rope_sections_within_head(part)


def _rope_sections_within_head(part) -> None:
    """Multimodal rotary sections (`mrope_section`: frequencies per t, h, w row, which the config class declares) sum
    to half the default head; scaled to half the shrunk head, in proportion, each at least 1. Where the config has
    none, the modeling code's default (16, 24, 24) is scaled."""
    hidden, heads = vars(part).get("hidden_size"), vars(part).get("num_attention_heads")
    head = vars(part).get("head_dim") or (hidden // heads if isinstance(hidden, int) and isinstance(heads, int) else None)
    declared = "mrope_section" in getattr(type(part), "ignore_keys_at_rope_validation", ())
    for name in ("rope_parameters", "rope_scaling"):
        rope = vars(part).get(name)
        if not isinstance(rope, dict) or not isinstance(head, int):
            continue
        sections = rope.get("mrope_section") or ([16, 24, 24] if declared else None)
        if not sections or sum(sections) == head // 2:
            continue
        scaled = [max(1, s * (head // 2) // sum(sections)) for s in sections]
        scaled[-1] += head // 2 - sum(scaled)
        if scaled[-1] >= 1:
            rope["mrope_section"] = scaled
        break


def _own_processor(model_type: str) -> str | None:
    """The one processor class the model type's own transformers module exports, if the mapping lacks it (a
    checkpoint names its class in processor_config.json, which AutoProcessor follows: Kosmos-2 on 5.23)."""
    import importlib

    from transformers.models.auto.configuration_auto import model_type_to_module_name

    try:
        module = importlib.import_module(f"transformers.models.{model_type_to_module_name(model_type)}")
    except ImportError:
        return None
    names = [n for n in getattr(module, "__all__", dir(module)) if n.endswith("Processor")
             and not n.endswith(("ImageProcessor", "VideoProcessor", "AudioProcessor"))]
    return names[0] if len(names) == 1 else None


def _processor(model_type: str, model, overrides: dict | None = None):
    """The model type's processor class (PROCESSOR_MAPPING_NAMES) over its tiny image processor and the tiny
    tokenizer; the tokenizer gets every special token the processor asks for (its `*_token` arguments' defaults,
    and the tokenizer attributes it reads, found from the AttributeError); arguments named like a config
    attribute take its value; `num_additional_image_tokens` counts the vision tower's class token."""
    import transformers
    from transformers.models.auto import processing_auto

    config = model.config

    name = processing_auto.PROCESSOR_MAPPING_NAMES.get(model_type) or _own_processor(model_type)
    if not name:
        raise Stage("processor", "no processor class in PROCESSOR_MAPPING_NAMES or in the model's module")
    cls = _class("processor", name)
    params = inspect.signature(cls.__init__).parameters
    tokens = {k: p.default for k, p in params.items() if k.endswith("_token") and isinstance(p.default, str)}
    kwargs = {}
    for param in params:
        for source in PROCESSOR_ALIASES.get(param, (param,)):
            value = _config_value(config, source)
            if value is not None and param not in ("image_processor", "tokenizer", "chat_template"):
                kwargs[param] = value
                break
    vision = getattr(config, "vision_config", None)
    if "num_image_tokens" in params and kwargs.get("num_image_tokens") is None and vision is not None:
        kwargs["num_image_tokens"] = (vision.image_size // vision.patch_size) ** 2  # LLaVA-OneVision: one tile's
    if "num_additional_image_tokens" in params:
        kwargs["num_additional_image_tokens"] = int(any(n.endswith("class_embedding") for n, _ in model.named_parameters()))
    kwargs.update(overrides or {})
    extra = {k: v for k in PROCESSOR_ALIASES if k not in params
             for v in [next(filter(None, map(partial(_config_value, config), PROCESSOR_ALIASES[k])), None)] if v}
    image_processor = _image_processor(model_type, config, extra) if "image_processor" in params else None
    sys.path.insert(0, str(HERE))
    from tiny import tiny_tokenizer

    expected = None  # the tokenizer class transformers 4.57's processor checks for (LlamaTokenizerFast ...)
    for _ in range(8):
        try:
            tokenizer = tiny_tokenizer(TINY["vocab_size"], extra=dict(tokens) or None, cls=expected)
        except Exception as e:  # BertTokenizerFast reads a normalizer the tiny tokenizer has not
            if expected is None:
                raise
            raise Stage("processor", f"{expected.__name__} over the tiny tokenizer: {one_line(e)}") from e
        subs = {k: None for k, p in params.items() if p.default is inspect.Parameter.empty and k != "self"
                and p.kind is p.POSITIONAL_OR_KEYWORD}
        subs.update({k: tokenizer for k in params if k.endswith("tokenizer")})  # InstructBLIP's qformer_tokenizer too
        if "image_processor" in params:
            subs["image_processor"] = image_processor
        if "video_processor" in params:
            subs["video_processor"] = _video_processor(model_type)
        try:
            processor = cls(**subs, **kwargs)
            unknown = {k: v for k, v in vars(processor).items() if k.endswith("_token") and isinstance(v, str)
                       and v not in tokenizer.get_vocab() and v not in tokens.values()}
            if not unknown:  # else again, with the tokens it sets itself (GOT-OCR2's <imgpad>) special
                return processor
            tokens.update(unknown)
            continue
        except (AttributeError, ValueError) as e:  # a tokenizer attribute it reads: one more special token
            words = [w.strip("'\"`.,").removesuffix("_id") for w in str(e).split()]
            missing = [w for w in words if w.endswith("_token")]
            if not missing or missing[-1] in tokens:
                raise Stage("processor", one_line(e)) from e
            tokens[missing[-1]] = f"<{missing[-1]}>"
        except TypeError as e:  # "Received a PreTrainedTokenizerFast for argument tokenizer, but a X was expected"
            names = re.findall(r"\w+TokenizerFast", str(e).split("but a", 1)[-1])
            if "argument tokenizer" not in str(e) or not names or expected is not None:
                raise Stage("processor", one_line(e)) from e
            expected = getattr(transformers, names[0])
        except KeyError as e:  # a token it looks up in the vocabulary (Fuyu's |SPEAKER|)
            if not isinstance(e.args[0], str) or e.args[0] in tokens.values():
                raise Stage("processor", one_line(e)) from e
            tokens[f"token_{len(tokens)}"] = e.args[0]
        except Exception as e:
            raise Stage("processor", one_line(e)) from e
    raise Stage("processor", "too many special tokens asked for")


def _token_ids_from(processor, config, input_ids) -> None:
    """The config's special-token ids (boi_token_index ...) set to the tiny tokenizer's ids of the tokens of the
    same name; the image token's (image_token_id / image_token_index) to the special token the processor repeats
    most in its prompts (the one image features replace: Aya Vision's is its patch token, not `<image>`)."""
    import torch

    tokenizer = processor.tokenizer
    special = torch.tensor(sorted(set(tokenizer.all_special_ids) - {0, 1, 2, 3}))
    ids = input_ids[torch.isin(input_ids, special)]
    repeated = int(ids.mode().values) if ids.numel() else None
    for part in _configs(config):
        for name in list(vars(part)):
            if not name.endswith(("_token_id", "_token_index")) or name.startswith(("pad_", "bos_", "eos_")):
                continue
            stem = name.rsplit("_", 1)[0]
            token = getattr(tokenizer, stem, None) or getattr(processor, stem, None)
            if stem == "image_token" and repeated is not None:
                setattr(part, name, repeated)
            elif isinstance(token, str) and token in tokenizer.get_vocab():
                setattr(part, name, tokenizer.convert_tokens_to_ids(token))


def _draw_zero_weights(model) -> None:
    """Draw the weight matrices a model's init leaves all zero (Gemma3's projection: every image would look the
    same), normal(0, 0.5), seeded."""
    import torch

    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() > 1 and parameter.is_floating_point() and not parameter.any():
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)


def _vlm_batch(processor) -> dict:
    """A batch of 2 prompts, one image each (the processor's image placeholder first where it has one), left-padded."""
    from optimum_dynamo.exporters.vision_language import default_image

    placeholder = (getattr(processor, "boi_token", None) or getattr(processor, "image_token", None)
                   or getattr(getattr(processor, "tokenizer", None), "image_token", None))
    placeholder = f"{placeholder} " if isinstance(placeholder, str) else ""
    texts = [f"{placeholder}{prompt}" for prompt in PROMPTS]
    # at the size the export observes (default_image's): a graph fixed to it (LLaVA-Next's tiles) takes only that one
    images = [default_image(seed=1), default_image(seed=2)]
    if hasattr(processor, "tokenizer"):
        processor.tokenizer.padding_side = "left"
    for text in (texts, PROMPTS):  # without the placeholder where the processor puts the image tokens itself
        for nested in ([[i] for i in images], images):
            try:
                return processor(images=nested, text=text, return_tensors="pt", padding=True)
            except Exception as e:
                error = e
    raise error


def _image_token_count(model, batch: dict, processor) -> dict:
    """The processor's image token count argument (num_image_tokens, image_seq_length ..., LLaVA's count of tokens
    beside the patches) set to the rows per image of the model's `get_image_features` (the default count is the
    default model's); {} if none (GOT-OCR2 takes it when called only, which its saved processor would not repeat)."""
    import torch

    get = getattr(model, "get_image_features", None) or getattr(getattr(model, "model", None), "get_image_features", None)
    params = inspect.signature(type(processor).__init__).parameters
    names = [n for n in ("num_image_tokens", "image_seq_length", "image_seq_len", "num_additional_image_tokens")
             if n in params]
    if get is None or not names:
        return {}
    try:
        with torch.no_grad():
            out = get(**{k: v for k, v in batch.items() if k in inspect.signature(get).parameters})
    except Exception:
        return {}
    rows = getattr(out, "pooler_output", out)
    rows = torch.cat([r.reshape(-1, r.shape[-1]) for r in rows]) if isinstance(rows, (list, tuple)) else rows
    count, images = rows.numel() // model.config.get_text_config().hidden_size, len(PROMPTS)
    if not isinstance(rows, torch.Tensor) or count % images:
        return {}
    if names[0] == "num_additional_image_tokens":  # LLaVA's processor counts patches: the tokens past them (VipLLaVA: none)
        image_id = getattr(model.config, "image_token_id", None) or getattr(model.config, "image_token_index", None)
        extra = processor.num_additional_image_tokens - int((batch["input_ids"] == image_id).sum() - count) // images
        return {names[0]: extra} if extra >= 0 else {}
    pixels = batch.get("pixel_values")
    units = pixels.shape[0] if isinstance(pixels, torch.Tensor) and pixels.dim() == 4 else images
    if count % units:
        return {}
    return {names[0]: count // units}  # per image, or per tile where the processor tiles them (InternVL)


def step_build_vlm(model_type: str, directory: Path) -> dict:
    """Child: the tiny model and processor, PyTorch's greedy tokens on a left-padded batch of 2 (one image each)."""
    import torch
    from transformers import AutoModelForImageTextToText, GenerationConfig

    try:
        try:
            config = tiny_config(model_type, TINY_VISION)
            _scaled_pixel_pairs(model_type, config)
            _within_shrunk_sizes(config)
        except Exception as e:
            raise Stage("config", one_line(e)) from e
        try:
            torch.manual_seed(0)
            model = AutoModelForImageTextToText.from_config(config).eval()
        except Exception as e:
            raise Stage("config", f"model: {one_line(e)}") from e
        _draw_zero_weights(model)
        model.generation_config = GenerationConfig(pad_token_id=0, bos_token_id=1, eos_token_id=2)
        overrides = {}
        for attempt in range(2):  # again with the image token count the model's features have
            try:
                processor = _processor(model_type, model, overrides)
            except ImportError as e:  # a torchvision-only class
                raise Stage("processor", one_line(e)) from e
            try:
                batch = _vlm_batch(processor)
            except Exception as e:
                raise Stage("processor", f"inputs: {one_line(e)}") from e
            _token_ids_from(processor, model.config, batch["input_ids"])
            # the reference is the saved checkpoint's, which the export loads: the token ids are set in the config after
            # the model is built, and a module may read one when built (T5Gemma 2's end-of-image embedding)
            model.save_pretrained(directory / "checkpoint")
            processor.save_pretrained(directory / "checkpoint")
            model = AutoModelForImageTextToText.from_pretrained(directory / "checkpoint").eval()
            params = inspect.signature(model.forward).parameters
            inputs = {k: v for k, v in batch.items() if k in params and k != "labels"}
            try:
                with torch.no_grad():
                    tokens = model.generate(**inputs, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                            do_sample=False)
                break
            except Exception as e:
                overrides = _image_token_count(model, batch, processor) if attempt == 0 and "tokens" in str(e) else {}
                if not overrides:
                    raise Stage("pytorch generate", one_line(e)) from e
    except Stage as e:
        return {"viable": False, "status": "fail", "stage": e.stage, "reason": e.reason}
    mask = inputs.get("attention_mask")
    padded = mask is not None and bool(mask[0, 0] == 0 or mask[1, 0] == 0)
    torch.save({"inputs": inputs, "tokens": tokens}, directory / "reference.pt")
    return {"viable": True, **({} if padded else {"note": "the processor's batch is not left-padded"})}


def step_check_vlm(directory: Path) -> dict:
    """Child: the export through ORTModelForImageTextToText against PyTorch's greedy tokens."""
    import torch

    from optimum_dynamo import ORTModelForImageTextToText

    reference = torch.load(directory / "reference.pt")
    try:
        model = ORTModelForImageTextToText.from_pretrained(directory / "onnx")
        with torch.no_grad():
            tokens = model.generate(**reference["inputs"], max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                    do_sample=False)
    except Exception as e:
        return {"ok": False, "reason": f"runtime: {one_line(e)}"}
    if not torch.equal(tokens, reference["tokens"]):
        return {"ok": False, "reason": "greedy tokens differ from PyTorch's"}
    return {"ok": True}


def _bounded():
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (ROW_MEMORY, ROW_MEMORY))


def _vlm_child(*args: str) -> dict:
    try:
        return child(*args, timeout=ROW_TIMEOUT, preexec_fn=_bounded)
    except subprocess.TimeoutExpired:
        return {"viable": False, "ok": False, "reason": f"over {ROW_TIMEOUT} s"}


def run_vlm_one(model_type: str, directory: Path) -> dict:
    """One image-text-to-text row: pass, or fail at a stage (config, processor, pytorch generate, export, parity)
    with one line; `viable`: PyTorch itself generates with the tiny model and processor."""
    row = {"model_type": model_type, **_vlm_child("--step", "build", "vlm", model_type, str(directory))}
    if not row["viable"]:
        return {**row, "status": "fail", "stage": row.get("stage", "config")}
    cli = Path(sys.executable).parent / "optimum-cli"
    start = time.perf_counter()
    try:
        export = subprocess.run([str(cli), "export", "onnx", "--dynamo", "--model", str(directory / "checkpoint"),
                                 "--task", KINDS["vlm"].task, str(directory / "onnx")], capture_output=True,
                                text=True, timeout=ROW_TIMEOUT, preexec_fn=_bounded)
    except subprocess.TimeoutExpired:
        return {**row, "status": "fail", "stage": "export", "reason": f"over {ROW_TIMEOUT} s", "export_s": ROW_TIMEOUT}
    row["export_s"] = round(time.perf_counter() - start, 1)
    if export.returncode != 0:
        return {**row, "status": "fail", "stage": "export", "reason": cli_error(export.stderr)}
    check = _vlm_child("--step", "check", "vlm", str(directory))
    if not check.get("ok"):
        return {**row, "status": "fail", "stage": "parity", "reason": check.get("reason", "")}
    return {**row, "status": "pass", "stage": "", "reason": ""}


def run(types: list[str], out: Path, root: Path, kind: str = "causal", merge: bool = False) -> None:
    """Rows into `out`; with `merge`, into the results already there (same mapping and versions): the rows of
    these types are replaced, the others kept."""
    results = {"versions": versions(), "date": time.strftime("%Y-%m-%d"), "mapping": KINDS[kind].mapping,
               "planned": types, "rows": []}
    if merge and out.exists():
        old = json.loads(out.read_text())
        if (old["mapping"], old["versions"]) != (results["mapping"], results["versions"]):
            raise SystemExit(f"{out}: results of another mapping or other versions, not merged")
        results["planned"] = old["planned"] + [t for t in types if t not in old["planned"]]
        results["rows"] = [r for r in old["rows"] if r["model_type"] not in types]
    for i, model_type in enumerate(types, 1):
        row = run_one(model_type, root, kind)
        results["rows"].append(row)
        results["rows"].sort(key=lambda r: r["model_type"])
        outcome = row.get("outcome") or " at ".join(filter(None, (row.get("status"), row.get("stage"))))
        print(f"[{i}/{len(types)}] {model_type}: {outcome or 'not viable'} {row.get('export_s', '')} "
              f"{row.get('reason', '')}", file=sys.stderr, flush=True)
        out.write_text(json.dumps(results, indent=1))  # partial results survive an interrupted run


# Refusals that are the right answer to the request, each in one line: `-with-past` for a model that keeps no
# cache; an encoder-decoder task for a decoder that transformers 5 maps as a seq2seq LM (audio-text models)
RIGHT_REFUSALS = {"no_cache": "returns no key/value cache", "not_seq2seq": "is not an encoder-decoder model"}


def summary(results: dict) -> dict:
    rows = [r for r in results["rows"] if r.get("viable")]
    count = lambda outcome: sum(r["outcome"] == outcome for r in rows)  # noqa: E731
    right = {key: sum(r["outcome"] == "refused" and text in r.get("reason", "") for r in rows)
             for key, text in RIGHT_REFUSALS.items()}
    correct = count("dynamo") + count("fallback") + sum(right.values())
    return {"types": len(results["rows"]), "viable": len(rows), "dynamo": count("dynamo"),
            "fallback": count("fallback"), "refused": count("refused"), **right, "fail": count("fail"),
            "correct": correct, "percent": round(100 * correct / len(rows)) if rows else 0,
            "max_export_s": max((r.get("export_s") or 0 for r in rows), default=0)}


def _cell(row: dict | None, planned: bool) -> str:
    if row is None:
        return "not run yet" if planned else "—"
    if not row.get("viable"):
        return "not viable in PyTorch"
    text = {"dynamo": "pass", "fallback": "pass (torchscript fallback)"}.get(row["outcome"], row["outcome"])
    reason = (row.get("reason", "") if row["outcome"] in ("refused", "fail") else row.get("note", "")).replace("|", "/")
    return f"{text}{f': {reason}' if reason else ''} ({row.get('export_s')} s)"


def _summary_line(name: str, results: dict) -> str:
    s, planned = summary(results), len(results.get("planned", ()))
    return (f"- **{name}** ({results['date']}; optimum {results['versions']['optimum']}, optimum-onnx "
            f"{results['versions']['optimum-onnx']}): {s['types']} model types, {s['viable']} viable in PyTorch; "
            f"**{s['correct']} correct ({s['percent']}%)**: {s['dynamo']} pass with `--dynamo`, {s['fallback']} "
            f"through the torchscript fallback, {s['no_cache']} `-with-past` refused because the model keeps no "
            f"cache, {s['not_seq2seq']} refused as not encoder-decoders; "
            f"{s['refused'] - s['no_cache'] - s['not_seq2seq']} other refusals, {s['fail']} fail; slowest export "
            f"{s['max_export_s']} s" + (f"; {planned - s['types']} of the {planned} planned types not run yet"
                                       if planned > s["types"] else ""))


def vlm_summary(results: dict) -> dict:
    rows = results["rows"]
    viable = [r for r in rows if r.get("viable")]
    stages = {}
    for row in rows:
        if row["status"] == "fail":
            stages[row["stage"]] = stages.get(row["stage"], 0) + 1
    passed = sum(r["status"] == "pass" for r in rows)
    return {"types": len(rows), "viable": len(viable), "pass": passed, "stages": stages,
            "percent": round(100 * passed / len(viable)) if viable else 0,
            "max_export_s": max((r.get("export_s") or 0 for r in viable), default=0)}


def _vlm_cell(row: dict | None, planned: bool) -> str:
    if row is None:
        return "not run yet" if planned else "—"
    reason = row.get("reason", "").replace("|", "/")
    if row["status"] == "pass":
        return f"pass ({row.get('export_s')} s)"
    text = f"fail at {row['stage']}: {reason}"
    return text + (f" ({row['export_s']} s)" if row.get("export_s") else "")


def _vlm_summary_line(name: str, results: dict) -> str:
    s, planned = vlm_summary(results), len(results.get("planned", ()))
    stages = ", ".join(f"{count} at {stage}" for stage, count in sorted(s["stages"].items()))
    return (f"- **{name}** ({results['date']}; optimum {results['versions']['optimum']}, optimum-onnx "
            f"{results['versions']['optimum-onnx']}): {s['types']} model types, {s['viable']} viable in PyTorch "
            f"(the tiny model and processor generate); **{s['pass']} pass ({s['percent']}% of the viable)**; "
            f"fail: {stages or 'none'}; slowest export {s['max_export_s']} s"
            + (f"; {planned - s['types']} of the {planned} planned types not run yet" if planned > s["types"] else ""))


def table(paths: list[Path]) -> str:
    """One section per auto mapping, one column per environment."""
    runs = [json.loads(p.read_text()) for p in paths]
    lines = []
    for kind in KINDS.values():
        group = [r for r in runs if r["mapping"] == kind.mapping]
        if not group:
            continue
        names = [f"transformers {r['versions']['transformers']}" for r in group]
        lines += [f"### {kind.title}: `{kind.mapping}`, `--task {kind.task}`, `{kind.runtime}`", ""]
        vlm = kind.task == KINDS["vlm"].task
        lines += [(_vlm_summary_line if vlm else _summary_line)(name, results) for name, results in zip(names, group)]
        by_type = [{r["model_type"]: r for r in results["rows"]} for results in group]
        planned = [set(results.get("planned", ())) for results in group]
        cell = _vlm_cell if vlm else _cell
        lines += ["", "| model type | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
        lines += [f"| {t} | " + " | ".join(cell(rows.get(t), t in plan) for rows, plan in zip(by_type, planned))
                  + " |" for t in sorted(set().union(*by_type))]
        lines.append("")
    return "\n".join(lines).rstrip()


def shared_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of every zoo script (this one, zoo_tasks.py)."""
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--only", nargs="*", help="these model types only")
    parser.add_argument("--work", type=Path, default=None, help="checkpoints and exports (default: a temp dir)")
    parser.add_argument("--table", nargs="*", type=Path, help="print the markdown tables of these results")
    parser.add_argument("--docs", type=Path, help="with --table: write them between this script's markers of this page")
    parser.add_argument("--step", nargs="+", help=argparse.SUPPRESS)


def show_table(args: argparse.Namespace, text: str, begin: str = BEGIN, end: str = END) -> None:
    """--table: printed, or with --docs written between the page's `begin` and `end` markers."""
    if not args.docs:
        print(text)
        return
    head, rest = args.docs.read_text().split(begin, 1)
    args.docs.write_text(f"{head}{begin}\n{text}\n{end}{rest.split(end, 1)[1]}")


def sections(block: str) -> dict[str, str]:
    """A generated block's `### ` sections by heading line, in order."""
    parts = re.split(r"^(?=### )", block.strip(), flags=re.M)
    return {part.splitlines()[0]: part.rstrip() for part in parts if part.startswith("### ")}


def kept_sections(docs: Path, text: str) -> str:
    """`text`'s sections, and the page's sections of the mappings it has no results for (a run of some kinds
    replaces theirs), in the page's order."""
    old = sections(docs.read_text().split(BEGIN, 1)[1].split(END, 1)[0])
    new = sections(text)
    merged = {**old, **new}
    return "\n\n".join(merged[heading] for heading in merged)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    shared_arguments(parser)
    parser.add_argument("--kind", choices=KINDS, default="causal", help="which auto mapping (default: causal)")
    parser.add_argument("--merge", action="store_true", help="replace these types' rows in an existing --json")
    parser.add_argument("--unlisted", action="store_true",
                        help="only the types the decoder sweep (tests/test_decoder_sweep.py) does not name")
    args = parser.parse_args()
    if args.step:
        step, kind, *rest = args.step
        if kind == "vlm":
            result = step_build_vlm(rest[0], Path(rest[1])) if step == "build" else step_check_vlm(Path(rest[0]))
        else:
            result = step_build(kind, rest[0], Path(rest[1])) if step == "build" else step_check(kind, Path(rest[0]))
        print(json.dumps(result))
        return
    if args.table:
        text = table(args.table)
        show_table(args, kept_sections(args.docs, text) if args.docs else text)
        return
    import tempfile

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    types = args.only or population(args.kind)
    if args.unlisted:
        types = [t for t in types if t not in listed(args.kind)]
    with tempfile.TemporaryDirectory() as tmp:
        run(types, args.json, args.work or Path(tmp), args.kind, args.merge)


if __name__ == "__main__":
    main()
