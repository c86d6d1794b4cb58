"""The zoo: every model type of one of transformers' own auto mappings (causal LM, seq2seq, speech
seq2seq), made tiny from its config class, kept where PyTorch itself can `generate` with it, exported by the
real `optimum-cli export onnx --dynamo` and run through optimum's runtime class against PyTorch (a batch of 2,
text rows left-padded: greedy tokens identical, logits within 1e-4 on real positions).
Every step runs in a child process; one row per model type.

    python tests/zoo.py --json t5.json [--kind causal|seq2seq|speech] [--only TYPE ...] [--unlisted] [--merge]
    python tests/zoo.py --table t4.json t5.json [--docs docs/status.md]      # the tables (into the docs' zoo section)

`make zoo` runs both environments and rewrites the zoo section of docs/status.md.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
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
    max_target_positions=64,
)
# Per model type, only where the generic shrink cannot work, each with its reason.
OVERRIDES: dict[str, tuple[dict, str]] = {
    "bamba": ({"attn_layer_indices": [1]}, "its default attention layers lie beyond 2 layers; the hybrid cache needs one"),
    "mamba2": ({"head_dim": 16, "n_groups": 1}, "num_heads * head_dim must equal expand * hidden_size; "
               "num_heads a multiple of n_groups"),
    "zamba": ({"num_hidden_layers": 5, "attn_layer_period": 2, "attn_layer_offset": 1},
              "its shared attention block is tied across hybrid layers: the pattern needs two"),
}


def _versions() -> dict:
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
                     "seq2seq": ("test_seq2seq_cli.py", ("MODELS",)), "speech": ("test_seq2seq_cli.py", ())}[kind]
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


def _shrunk(default, layers_from_overrides: bool) -> dict:
    own = inspect.signature(type(default).__init__).parameters  # not the generation defaults of old configs (top_k)
    kwargs = {k: v for k, v in TINY.items() if k in own}
    if not layers_from_overrides:  # an override that sets the depth sets the pattern too
        kwargs.update(_layer_kinds(default, own, kwargs.get("num_hidden_layers", 2)))
    return kwargs


def _shrunk_sub_config(sub) -> dict | None:
    """A composite model's sub-config (text, vision, audio) shrunk the same way, as the dict its parent's
    constructor takes (per-layer lists of the default depth left for the constructor to derive); None where
    its class takes no such dict (dbrx's sub-configs refuse their own serialized keys): left as it is."""
    depth = getattr(sub, "num_hidden_layers", None)
    kept = {k: v for k, v in sub.to_dict().items() if not (isinstance(v, list) and depth and len(v) == depth)}
    try:
        shrunk = type(sub)(**{**kept, **_shrunk(sub, False)})
    except Exception:
        return None
    if hasattr(shrunk, "vocab_size"):
        _small_token_ids(shrunk)
    return shrunk.to_dict()


def tiny_config(model_type: str):
    """The model type's default config, shrunk generically, its sub-configs too."""
    from transformers import AutoConfig, PretrainedConfig

    default = AutoConfig.for_model(model_type)
    extra, _ = OVERRIDES.get(model_type, ({}, ""))
    kwargs = _shrunk(default, "num_hidden_layers" in extra)
    for name in getattr(type(default), "sub_configs", {}):
        if isinstance(getattr(default, name, None), PretrainedConfig) and name not in extra:
            if (sub := _shrunk_sub_config(getattr(default, name))) is not None:
                kwargs[name] = sub
    config = AutoConfig.for_model(model_type, **{**kwargs, **extra})
    _small_token_ids(config)
    return config


def _small_token_ids(config) -> None:
    """Token ids of the full vocabulary brought into the tiny one: pad / bos / eos = 0 / 1 / 2 (a decoder's
    start = bos), any other (image, separator, mask...) to distinct ids from the top, which the prompts
    do not use."""
    config.pad_token_id, config.bos_token_id, config.eos_token_id = 0, 1, 2
    top = TINY["vocab_size"] - 1
    for name in sorted(vars(config)):
        value = getattr(config, name)
        if name in ("decoder_start_token_id", "decoder_bos_token_id") and isinstance(value, int):
            setattr(config, name, 1)
        elif (name.endswith(("_token_id", "_token_index")) and isinstance(value, int)
              and value >= TINY["vocab_size"]):
            setattr(config, name, top)
            top -= 1


def _one_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0][:200] if lines else ''}"


def _inputs(kind: str, config, tokenizer) -> dict:
    """A batch of 2: text rows left-padded; speech as log-mel-like features (2 x max_source_positions frames,
    the shape the export synthesizes when a checkpoint has no feature extractor)."""
    import torch

    if kind != "speech":
        batch = tokenizer(PROMPTS, return_tensors="pt", padding=True)
        return {k: batch[k] for k in ("input_ids", "attention_mask")}
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
        inputs = _inputs(kind, config, tokenizer)
        with torch.no_grad():
            return model, inputs, *_greedy_and_logits(kind, model, inputs), _each_row_alone(kind, model, inputs)

    tokenizer = tiny_tokenizer(TINY["vocab_size"])
    try:
        model, inputs, tokens, logits, rows = build(tiny_config(model_type))
        model.save_pretrained(directory / "checkpoint")
        tokenizer.save_pretrained(directory / "checkpoint")
    except Exception as e:  # PyTorch cannot run it: outside the population
        return {"viable": False, "reason": _one_line(e)}
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
        return {"ok": False, "reason": f"runtime: {_one_line(e)}"}
    note = ""
    if not torch.equal(tokens, reference["tokens"]):
        rows = reference.get("rows")
        if rows is None or not torch.equal(tokens[:, -NEW_TOKENS:], rows):
            return {"ok": False, "reason": f"greedy tokens differ (logits within {diff:.1e})", "max_abs": diff}
        note = "PyTorch's batched generate differs; tokens equal each row generated alone"
    if not diff < ATOL:
        return {"ok": False, "reason": f"logits differ by {diff:.1e}", "max_abs": diff}
    return {"ok": True, "max_abs": diff, "note": note}


def _child(*args: str, timeout: int = 900) -> dict:
    run = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, timeout=timeout)
    lines = run.stdout.strip().splitlines()
    if run.returncode != 0 or not lines:
        lines = [line for line in run.stderr.strip().splitlines() if line.strip()]
        errors = [line for line in lines if "Error" in line]
        reason = errors[-1][:200] if errors else f"exit status {run.returncode}, no error line"
        return {"viable": False, "ok": False, "reason": f"child failed: {reason}"}
    return json.loads(lines[-1])


def _cli_error(stderr: str) -> str:
    errors = [line for line in stderr.splitlines() if ": error: " in line]
    if errors:
        return errors[-1].split(": error: ", 1)[1][:300]
    tail = [line for line in stderr.splitlines() if line.strip()]
    return (tail[-1] if tail else "no output")[:300]


def run_one(model_type: str, root: Path, kind: str = "causal") -> dict:
    """One row: viable?, then the export's outcome (dynamo / fallback / refused / fail) and its wall time."""
    directory = root / model_type
    directory.mkdir(parents=True, exist_ok=True)
    row = {"model_type": model_type, **_child("--step", "build", kind, model_type, str(directory))}
    if not row["viable"]:
        return row
    cli = Path(sys.executable).parent / "optimum-cli"
    start = time.perf_counter()
    try:
        export = subprocess.run([str(cli), "export", "onnx", "--dynamo", "--model", str(directory / "checkpoint"),
                                 "--task", KINDS[kind].task, str(directory / "onnx")], capture_output=True, text=True,
                                timeout=EXPORT_TIMEOUT)
    except subprocess.TimeoutExpired:
        return {**row, "outcome": "fail", "reason": f"export over {EXPORT_TIMEOUT} s", "export_s": EXPORT_TIMEOUT}
    row["export_s"] = round(time.perf_counter() - start, 1)
    if export.returncode != 0:
        return {**row, "outcome": "refused", "reason": _cli_error(export.stderr)}
    manifest = json.loads((directory / "onnx" / "optimum_dynamo.json").read_text())
    check = _child("--step", "check", kind, str(directory))
    exporter = "fallback" if manifest["exporter"] == "torchscript-fallback" else "dynamo"
    row.update(outcome=exporter if check["ok"] else "fail", reason=check.get("reason", ""),
               max_abs=check.get("max_abs"), **({"note": check["note"]} if check.get("note") else {}))
    if exporter == "fallback":
        row["fallback_reason"] = manifest.get("fallback_reason", "")
    return row


def run(types: list[str], out: Path, root: Path, kind: str = "causal", merge: bool = False) -> None:
    """Rows into `out`; with `merge`, into the results already there (same mapping and versions): the rows of
    these types are replaced, the others kept."""
    results = {"versions": _versions(), "date": time.strftime("%Y-%m-%d"), "mapping": KINDS[kind].mapping,
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
        print(f"[{i}/{len(types)}] {model_type}: {row.get('outcome', 'not viable')} {row.get('export_s', '')} "
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
        lines += [_summary_line(name, results) for name, results in zip(names, group)]
        by_type = [{r["model_type"]: r for r in results["rows"]} for results in group]
        planned = [set(results.get("planned", ())) for results in group]
        lines += ["", "| model type | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
        lines += [f"| {t} | " + " | ".join(_cell(rows.get(t), t in plan) for rows, plan in zip(by_type, planned))
                  + " |" for t in sorted(set().union(*by_type))]
        lines.append("")
    return "\n".join(lines).rstrip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--kind", choices=KINDS, default="causal", help="which auto mapping (default: causal)")
    parser.add_argument("--only", nargs="*", help="these model types only")
    parser.add_argument("--merge", action="store_true", help="replace these types' rows in an existing --json")
    parser.add_argument("--unlisted", action="store_true",
                        help="only the types the decoder sweep (tests/test_decoder_sweep.py) does not name")
    parser.add_argument("--work", type=Path, default=None, help="checkpoints and exports (default: a temp dir)")
    parser.add_argument("--table", nargs="*", type=Path, help="print the markdown table of these results")
    parser.add_argument("--docs", type=Path, help="with --table: write it between the zoo markers of this page")
    parser.add_argument("--step", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.step:
        step, kind, *rest = args.step
        result = step_build(kind, rest[0], Path(rest[1])) if step == "build" else step_check(kind, Path(rest[0]))
        print(json.dumps(result))
        return
    if args.table:
        text = table(args.table)
        if args.docs:
            page = args.docs.read_text()
            head, rest = page.split(BEGIN, 1)
            args.docs.write_text(f"{head}{BEGIN}\n{text}\n{END}{rest.split(END, 1)[1]}")
        else:
            print(text)
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
