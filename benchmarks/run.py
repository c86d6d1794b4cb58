"""Side-by-side benchmark of the `--dynamo` and torchscript exporters (on demand: `make bench`).

Builds its models from config (random weights, no Hub), exports each with both exporters through the
real `optimum-cli` (one child process per export: wall time and peak RSS of that child), then measures
in this process: decode-step latency (batch 1, past 128, 1 and 2 threads), greedy tokens/s through
ORTModelForCausalLM (checked against PyTorch's tokens), and the capture's overhead over one plain
`generate`. Prints ratios measured in the same run; graphs alternate within each timing round.

    python benchmarks/run.py [--models tiny,llama56m,qwen05b] [--exports "torchscript,dynamo O3"]
                             [--anchor llama56m:genai=DIR] [--export-only] [--checkpoints-only] [--work DIR]
                             [--tokens 64]

`--anchor`: a graph built by another tool from the same checkpoint (`--work DIR` keeps the checkpoints in
DIR/checkpoints), e.g. onnxruntime-genai's model builder in a transformers-5 environment:
`python -m onnxruntime_genai.models.builder -i DIR/checkpoints/llama56m -o GENAI -p fp32 -e cpu` (`-p int4`:
MatMulNBits, 4 bits, block 32, symmetric, accuracy level 4, the embedding left fp32). `make anchor` builds that
environment (.venv-genai: torch 2.13.0, transformers 5.23.0, onnxruntime-genai 0.18.0) and both graphs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # tiny.py: tiny checkpoints

sys.path.insert(0, str(Path(__file__).parent))

import decode_step  # noqa: E402

MODELS = {
    "tiny": dict(model_type="llama"),
    "llama56m": dict(model_type="llama", vocab_size=32000, hidden_size=512, intermediate_size=1376,
                     num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4, head_dim=64,
                     max_position_embeddings=2048),
    "qwen05b": dict(model_type="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864,
                    num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2, head_dim=64,
                    max_position_embeddings=4096, tie_word_embeddings=True),
    # export memory at scale (over protobuf's 2 GB): `--exports "dynamo,dynamo streamed" --export-only`
    "llama084b": dict(model_type="llama", vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                      num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=4, head_dim=128,
                      max_position_embeddings=2048),
}
# (label, exporter flags); the first is the reference of every ratio
EXPORTS = [
    ("torchscript", []),
    ("torchscript O3", ["--optimize", "O3"]),
    ("dynamo", ["--dynamo"]),
    ("dynamo O1", ["--dynamo", "--optimize", "O1"]),
    ("dynamo O2", ["--dynamo", "--optimize", "O2"]),
    ("dynamo O3", ["--dynamo", "--optimize", "O3"]),
    ("dynamo O3 int4", ["--dynamo", "--optimize", "O3", "--quantize", "int4"]),
    ("dynamo O3 int8", ["--dynamo", "--optimize", "O3", "--quantize", "int8"]),
    ("dynamo fp16", ["--dynamo", "--dtype", "fp16"]),
]
# any label + " streamed": the same flags with the weights streamed from the checkpoint (docs: Big models)
STREAMED = " streamed"


def build(name: str, root: Path) -> Path:
    from tiny import save_tiny_decoder

    spec = dict(MODELS[name])
    return save_tiny_decoder(spec.pop("model_type"), root / name, **spec)


def export(checkpoint: Path, out: Path, flags: list[str], streamed: bool = False) -> dict:
    """One `optimum-cli export onnx` child: wall seconds, peak RSS (MB) of that child."""
    cli = Path(sys.executable).parent / "optimum-cli"
    cmd = [str(cli), "export", "onnx", *flags, "--model", str(checkpoint), "--task", "text-generation-with-past", str(out)]
    env = dict(os.environ, OPTIMUM_DYNAMO_STREAM_WEIGHTS="1" if streamed else "0")
    out.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(out.parent / f"{out.name}.log", "w") as log:
        child = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    if status != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed, see {out.parent / (out.name + '.log')}")
    manifest = out / "optimum_dynamo.json"
    ops = json.loads(manifest.read_text()).get("contrib_ops", {}) if manifest.exists() else {}
    if not manifest.exists():
        ops = torchscript_contrib_ops(out / "model.onnx")
    return dict(wall_s=wall, rss_mb=usage.ru_maxrss / 1024, nodes=node_count(out / "model.onnx"), ops=ops)


def node_count(path: Path) -> int:
    import onnx

    return len(onnx.load(str(path), load_external_data=False).graph.node)


def torchscript_contrib_ops(path: Path) -> dict:
    import collections

    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    return dict(collections.Counter(n.op_type for n in graph.node if n.domain == "com.microsoft"))


def greedy_tok_s(out: Path, checkpoint: Path, tokens: int, rounds: int = 3) -> tuple[float, bool]:
    """Greedy tokens/s of batch 1 through ORTModelForCausalLM, and whether they equal PyTorch's."""
    import torch
    from optimum.onnxruntime import ORTModelForCausalLM
    from transformers import AutoModelForCausalLM

    ids = torch.tensor([[1, 5, 9, 13, 17, 21, 25, 29]])
    args = dict(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens, min_new_tokens=tokens,
                do_sample=False, pad_token_id=0)
    model = ORTModelForCausalLM.from_pretrained(out)
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        got = model.generate(**args)
        best = min(best, time.perf_counter() - start)
    expected = AutoModelForCausalLM.from_pretrained(checkpoint).eval().generate(**args)
    return tokens / best, bool(torch.equal(got, expected))


def prefill_logits(path: str, checkpoint: Path, ids) -> "np.ndarray":
    """[positions, vocab] logits of one prompt from position 0 (empty cache), any graph with optimum's names."""
    import numpy as np

    session = decode_step.session(path, 2)
    feed = decode_step.decode_feed(session, Path(path).parent, past=0)
    feed.update(input_ids=ids, attention_mask=np.ones_like(ids))
    if "position_ids" in feed:
        feed["position_ids"] = np.arange(ids.shape[1])[None]
    names = [o.name for o in session.get_outputs()]
    return session.run(["logits"], {k: v for k, v in feed.items() if k in {i.name for i in session.get_inputs()}}
                       )[0][0] if "logits" in names else None


def top1_agreement(paths: dict[str, str], checkpoint: Path, positions: int = 256) -> dict[str, dict[str, float]]:
    """Next-token top-1 agreement of every graph with PyTorch and with each other (one random prompt)."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    ids = np.random.default_rng(0).integers(3, model.config.vocab_size, (1, positions))
    with torch.no_grad():
        top = {"PyTorch": model(input_ids=torch.from_numpy(ids)).logits[0].argmax(-1).numpy()}
    top.update({label: prefill_logits(path, checkpoint, ids).argmax(-1) for label, path in paths.items()})
    return {a: {b: float((top[a] == top[b]).mean()) for b in top} for a in top}


def capture_overhead(checkpoint: Path, rounds: int = 3) -> float:
    """Time of the capture driver under the InputObserver over the same driver unobserved (min of rounds)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from optimum_dynamo.capture import InputObserver
    from optimum_dynamo.capture.drivers import drive_text_generation

    model = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    plain = observed = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        drive_text_generation(model, tokenizer)
        plain = min(plain, time.perf_counter() - start)
        start = time.perf_counter()
        with InputObserver(model, "model"):
            drive_text_generation(model, tokenizer)
        observed = min(observed, time.perf_counter() - start)
    return observed / plain


def versions() -> str:
    from optimum_dynamo.manifest import versions as found

    return ", ".join(f"{k} {v}" for k, v in found().items())


def weights_mb(checkpoint: Path) -> float:
    return sum(f.stat().st_size for f in checkpoint.glob("*.safetensors")) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="tiny,llama56m")
    parser.add_argument("--work", default=None)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--exports", default=",".join(label for label, _ in EXPORTS if label != "dynamo fp16"),
                        help=f"comma-separated labels of {[label for label, _ in EXPORTS]}, each optionally + '{STREAMED}'")
    parser.add_argument("--anchor", action="append", default=[], metavar="MODEL:LABEL=DIR",
                        help="another tool's graph of MODEL's checkpoint (DIR/model.onnx, e.g. onnxruntime-genai's "
                             "model builder) measured in the same decode-step rounds")
    parser.add_argument("--export-only", action="store_true", help="export wall and peak RSS only")
    parser.add_argument("--checkpoints-only", action="store_true", help="build the checkpoints in --work and stop")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    root = Path(args.work or tempfile.mkdtemp(prefix="optimum-dynamo-bench-"))
    wanted = args.exports.split(",")
    print(f"# {datetime.date.today()} | {platform.machine()}, {os.cpu_count()} cores, {platform.python_version()} | {versions()}")
    for name in args.models.split(","):
        checkpoint = build(name, root / "checkpoints")
        if args.checkpoints_only:
            print(f"{name}: {checkpoint}")
            continue
        weights = weights_mb(checkpoint)
        rows = {}
        flags_of = dict(EXPORTS)
        for label in wanted:
            base = label.removesuffix(STREAMED)
            rows[label] = export(checkpoint, root / name / label.replace(" ", "_"), flags_of[base], label != base)
        ref = next(iter(rows))
        print(f"\n## {name} ({weights:.0f} MB of fp32 weights): export, ratios vs {ref}")
        print("| export | wall s (ratio) | peak RSS MB (ratio; x weights) | nodes | contrib ops |")
        print("|---|---|---|---|---|")
        for label, row in rows.items():
            ops = ", ".join(f"{k} {v}" for k, v in row["ops"].items()) or "—"
            of_weights = f"; {row['rss_mb'] / weights:.2f}x" if weights > 50 else ""  # meaningless for tiny models
            print(f"| {label} | {row['wall_s']:.1f} ({row['wall_s'] / rows[ref]['wall_s']:.2f}) "
                  f"| {row['rss_mb']:.0f} ({row['rss_mb'] / rows[ref]['rss_mb']:.2f}{of_weights}) | {row['nodes']} | {ops} |")
        if args.export_only:
            continue
        paths = {label: str(root / name / label.replace(" ", "_") / "model.onnx") for label in rows}
        for anchor in args.anchor:
            model, _, rest = anchor.partition(":")
            label, _, directory = rest.partition("=")
            if model == name:
                paths[label] = str(Path(directory) / "model.onnx")
        steps = {threads: decode_step.step_ms(paths, threads) for threads in (1, 2)}
        print(f"\n## {name}: decode step (batch 1, past 128), speedup vs {ref} (median of per-round ratios), "
              f"greedy {args.tokens} tokens through ORTModelForCausalLM")
        print("| graph | 1 thread ms (speedup) | 2 threads ms (speedup) | greedy tok/s | tokens = PyTorch |")
        print("|---|---|---|---|---|")
        for label in paths:
            (ms1, x1), (ms2, x2) = steps[1][label], steps[2][label]
            tok_s, same = greedy_tok_s(Path(paths[label]).parent, checkpoint, args.tokens) if label in rows else (None, None)
            greedy = f"{tok_s:.0f} | {same}" if tok_s else "— | —"
            print(f"| {label} | {ms1:.2f} ({x1:.2f}) | {ms2:.2f} ({x2:.2f}) | {greedy} |")
        agree = top1_agreement(paths, checkpoint)
        anchors = [label for label in paths if label not in rows]
        print(f"\n## {name}: next-token top-1 agreement (one random prompt, {256} positions, from an empty cache)")
        print("| graph | vs PyTorch |" + "".join(f" vs {a} |" for a in anchors))
        print("|---|---|" + "---|" * len(anchors))
        for label in paths:
            print(f"| {label} | {agree[label]['PyTorch']:.3f} |" + "".join(f" {agree[label][a]:.3f} |" for a in anchors))
        print(f"\ncapture overhead ({name}): observed drive / plain drive = {capture_overhead(checkpoint):.2f}")


if __name__ == "__main__":
    main()
