"""Big checkpoints under a memory cap (on demand: `make bench-big`; issue 36's measuring stick).

Writes a checkpoint with a real model's shapes (default: Llama-3.1-8B's; random bf16 weights, safetensors
shards of ~2 GB, an index, a tokenizer) one shard at a time: the model is built on the meta device and each
shard's tensors are made, saved and dropped, so the whole model is never in memory. Then runs each export
through the real `optimum-cli` (or onnxruntime-genai's builder, `--anchor`) in a child process inside a cgroup-v1
memory cap (a child group of the memory controller; the cap counts page cache, as a container's does) and
records wall time, the group's peak usage, whether the kernel killed it for memory, and the last stage it
started (`[k/N] label` in its log).

    sudo python benchmarks/big.py [--shape llama8b] [--cap-gb 8] [--exports "dynamo O3 int4,dynamo fp16"]
                                  [--work DIR] [--anchor GENAI_PYTHON] [--keep]
                                  [--checkpoint DIR] [--stream] [--no-check]

`--checkpoint`: an existing checkpoint instead of `--shape`'s (e.g. `benchmarks/run.py`'s 0.84B llama);
`--stream`: OPTIMUM_DYNAMO_STREAM_WEIGHTS=1 (models under 1 GiB of weights are not streamed by default); `--no-check`: no
runtime check after the export (its session holds the whole graph).

Writing the 8B checkpoint needs 15 GB of disk and the fp16 export 16 GB more: `--work` on a disk with room.
The checkpoint is kept in `--work` for the next run; the exports are removed unless `--keep`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # tiny.py: the tokenizer

SHAPES = {
    # Llama-3.1-8B's shapes (8.03B parameters)
    "llama8b": dict(model_type="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                    num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                    max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5),
    # the same family at 1.2B, to try the harness quickly
    "llama1b": dict(model_type="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                    num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                    max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=True),
}
EXPORTS = {
    "dynamo O3 int4": ["--dynamo", "--optimize", "O3", "--quantize", "int4"],
    "dynamo fp16": ["--dynamo", "--dtype", "fp16"],
    "dynamo": ["--dynamo"],
    "dynamo O3": ["--dynamo", "--optimize", "O3"],
}
SHARD_BYTES = 2 * 2**30
CGROUP = Path("/sys/fs/cgroup/memory")
STAGE = re.compile(r"^\[(\d+)/(\d+)\] (.+)$")


def write_checkpoint(shape: str, path: Path, seed: int = 0) -> Path:
    """The checkpoint of `shape` in `path` (bf16, sharded), written shard by shard; kept if already complete."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    from tiny import tiny_tokenizer

    if (path / "model.safetensors.index.json").exists():
        return path
    spec = dict(SHAPES[shape])
    config = AutoConfig.for_model(spec.pop("model_type"), **spec, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    config.torch_dtype = torch.bfloat16
    config.architectures = ["LlamaForCausalLM"]  # as hub checkpoints have it (the genai builder reads it)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    tied = {k for k in ("lm_head.weight",) if config.tie_word_embeddings}
    shapes = {k: v.shape for k, v in model.state_dict().items() if k not in tied}
    del model
    generator = torch.Generator().manual_seed(seed)
    path.mkdir(parents=True, exist_ok=True)
    shards, shard, size, total = [], {}, 0, 0

    def flush():
        name = f"model-{len(shards) + 1:05d}-of-NNNNN.safetensors"
        save_file(shard, str(path / name), metadata={"format": "pt"})
        shards.append((name, list(shard)))

    for key, dims in shapes.items():
        if key.endswith("norm.weight"):
            tensor = torch.ones(dims, dtype=torch.bfloat16)
        else:
            tensor = (torch.randn(dims, generator=generator) * 0.02).to(torch.bfloat16)
        nbytes = tensor.numel() * 2
        if shard and size + nbytes > SHARD_BYTES:
            flush()
            shard, size = {}, 0
        shard[key], size, total = tensor, size + nbytes, total + nbytes
    flush()
    weight_map = {}
    for index, (name, keys) in enumerate(shards):
        final = name.replace("NNNNN", f"{len(shards):05d}")
        (path / name).rename(path / final)
        weight_map.update({k: final for k in keys})
    config.save_pretrained(path)
    GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0).save_pretrained(path)
    tiny_tokenizer(config.vocab_size).save_pretrained(path)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return path


def capped(cmd: list[str], cap_bytes: int, log: Path) -> dict:
    """Run `cmd` in a fresh memory cgroup capped at `cap_bytes`: wall s, peak bytes, killed for memory, last stage."""
    group = CGROUP / f"optimum-dynamo-big-{os.getpid()}"
    group.mkdir()
    try:
        (group / "memory.limit_in_bytes").write_text(str(cap_bytes))
        procs = str(group / "cgroup.procs")

        def enter():  # in the child, before exec: the whole process tree is in the group
            with open(procs, "w") as f:
                f.write(str(os.getpid()))

        start = time.perf_counter()
        with open(log, "w") as out:
            child = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, preexec_fn=enter)
            status = child.wait()
        wall = time.perf_counter() - start
        peak = int((group / "memory.max_usage_in_bytes").read_text())
        oom = int(dict(line.split() for line in (group / "memory.oom_control").read_text().splitlines()).get("oom_kill", 0))
    finally:
        for pid in (group / "cgroup.procs").read_text().split():
            os.kill(int(pid), signal.SIGKILL)
        time.sleep(0.5)
        group.rmdir()
    stages = [m.group(0) for m in map(STAGE.match, log.read_text(errors="replace").splitlines()) if m]
    return dict(wall_s=wall, peak_gb=peak / 2**30, status=status, killed=status == -signal.SIGKILL or oom > 0,
                last_stage=stages[-1] if stages else "—")


def check(out: Path, checkpoint: Path) -> dict:
    """The exported graph in ORTModelForCausalLM against PyTorch's model in the checkpoint's dtype (bf16, memory-mapped):
    greedy tokens of a left-padded batch of two, and next-token top-1 agreement over the prompts' real positions."""
    import torch
    from optimum.onnxruntime import ORTModelForCausalLM
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    batch = tokenizer(["the cat sat on the mat and looked at the dog", "a dog"], return_tensors="pt", padding=True,
                      return_token_type_ids=False)
    options = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    onnx_model = ORTModelForCausalLM.from_pretrained(out)
    got = onnx_model.generate(**batch, **options)
    onnx_logits = onnx_model(**batch).logits
    del onnx_model
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16).eval()
    with torch.no_grad():
        expected = model.generate(**batch, **options)
        logits = model(**batch).logits
    keep = batch["attention_mask"].bool()
    top1 = (onnx_logits.argmax(-1)[keep] == logits.argmax(-1)[keep]).float().mean().item()
    return dict(same_tokens=got.tolist() == expected.tolist(), top1=round(top1, 3))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="llama8b", choices=sorted(SHAPES))
    parser.add_argument("--cap-gb", type=float, default=8.0)
    parser.add_argument("--exports", default="dynamo O3 int4,dynamo fp16")
    parser.add_argument("--work", default="/tmp/optimum-dynamo-big")
    parser.add_argument("--anchor", default=None, metavar="PYTHON",
                        help="a Python with onnxruntime-genai (make anchor's .venv-genai): its builder, -p int4 -e cpu")
    parser.add_argument("--keep", action="store_true", help="keep the exported graphs")
    parser.add_argument("--checkpoint", type=Path, default=None, help="this checkpoint instead of --shape's")
    parser.add_argument("--stream", action="store_true", help="force streamed weights (OPTIMUM_DYNAMO_STREAM_WEIGHTS=1)")
    parser.add_argument("--no-check", action="store_true", help="no runtime check after each export")
    parser.add_argument("--check", nargs=2, metavar=("OUT", "CHECKPOINT"), help=argparse.SUPPRESS)  # the capped child
    args = parser.parse_args()
    if args.check:
        print("CHECK " + json.dumps(check(Path(args.check[0]), Path(args.check[1]))))
        return
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    work = Path(args.work)
    start = time.perf_counter()
    if args.stream:
        os.environ["OPTIMUM_DYNAMO_STREAM_WEIGHTS"] = "1"
    checkpoint = args.checkpoint or write_checkpoint(args.shape, work / args.shape)
    size = sum(f.stat().st_size for f in checkpoint.glob("*.safetensors")) / 2**30
    print(f"# {datetime.date.today()} | {args.checkpoint or args.shape}: {size:.1f} GB of safetensors "
          f"{'(weights streamed: forced) ' if args.stream else ''}"
          f"(written in {time.perf_counter() - start:.0f} s or kept) | cap {args.cap_gb:g} GB (page cache included)")
    cli = str(Path(sys.executable).parent / "optimum-cli")
    runs = {label: [cli, "export", "onnx", *EXPORTS[label], "--model", str(checkpoint), "--task",
                    "text-generation-with-past"] for label in args.exports.split(",")}
    if args.anchor:
        runs["onnxruntime-genai builder int4"] = [args.anchor, "-m", "onnxruntime_genai.models.builder", "-i",
                                                  str(checkpoint), "-p", "int4", "-e", "cpu"]
    print("| export | result | wall s | peak GB (cgroup) | last stage started | ORTModelForCausalLM vs PyTorch bf16 (same cap) |")
    print("|---|---|---|---|---|---|")
    for label, cmd in runs.items():
        out = work / "out" / label.replace(" ", "_")
        subprocess.run(["rm", "-rf", str(out)], check=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        cmd = [*cmd, "-o", str(out)] if "builder" in cmd else [*cmd, str(out)]
        row = capped(cmd, int(args.cap_gb * 2**30), out.parent / f"{out.name}.log")
        result = "killed (memory)" if row["killed"] else ("ok" if row["status"] == 0 else f"exit {row['status']}")
        compared = "—"
        if row["status"] == 0 and "builder" not in cmd and not args.no_check:
            log = out.parent / f"{out.name}.check.log"
            done = capped([sys.executable, __file__, "--check", str(out), str(checkpoint)], int(args.cap_gb * 2**30), log)
            found = [json.loads(line[6:]) for line in log.read_text().splitlines() if line.startswith("CHECK ")]
            compared = (f"greedy tokens equal: {found[0]['same_tokens']}, top-1 {found[0]['top1']} ({done['wall_s']:.0f} s)"
                        if found else f"failed ({'killed (memory)' if done['killed'] else 'see ' + log.name})")
        print(f"| {label} | {result} | {row['wall_s']:.0f} | {row['peak_gb']:.1f} | {row['last_stage']} | {compared} |",
              flush=True)
        if not args.keep:
            subprocess.run(["rm", "-rf", str(out)], check=True)


if __name__ == "__main__":
    main()
