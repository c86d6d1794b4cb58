"""Decode-step latency of exported decoders: batch 1, one new token over a given past, onnxruntime CPU.

Graphs are measured side by side: each round runs every graph (a warm-up step, then `steps` timed
steps; each round starts with the next graph) and keeps each graph's median step; a graph's speedup is the
median over rounds of the first graph's round median divided by its own. On a machine whose memory bandwidth
varies (other tenants), per-round ratios are what stays comparable; the minimum over a run is not.

Where a session was created matters as much: in one process, four sessions of the same graph measured up to
16% apart, the first created usually the slowest (memory placement). So the rounds run in fresh processes,
a few in each, each process creating its sessions in another rotation of the order: in each Latin square of
processes every graph is created first once, second once, and so on, and no graph is favoured by its place
in the list; several squares average the placement out.

    python benchmarks/decode_step.py ts=DIR/model.onnx o3=DIR/model.onnx [threads=1] [squares=4]
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def decode_feed(session, directory: Path, past: int = 128, batch: int = 1) -> dict[str, np.ndarray]:
    """Inputs of one decode step: one new token after `past` cached positions (random cache values).
    `directory` holds the graph and its configuration."""
    rng = np.random.default_rng(0)
    feed = {}
    for inp in session.get_inputs():
        name = inp.name
        if name == "input_ids":
            feed[name] = np.full((batch, 1), 5, dtype=np.int64)
        elif name == "attention_mask":
            feed[name] = np.ones((batch, past + 1), dtype=np.int64)
        elif name == "position_ids":
            feed[name] = np.full((batch, 1), past, dtype=np.int64)
        elif name.startswith("past_key_values."):
            heads, head_dim = inp.shape[1], inp.shape[3]
            if not isinstance(head_dim, int):
                head_dim = head_dim_of(directory)
            feed[name] = rng.standard_normal((batch, heads, past, head_dim)).astype(np.float32)
        else:
            raise ValueError(f"unexpected input {name}")
    return feed


def head_dim_of(directory: Path) -> int:
    """A graph that leaves the cache's head dimension symbolic (onnxruntime-genai's builder): read it from
    the configuration beside it (genai_config.json, else config.json)."""
    if (directory / "genai_config.json").exists():
        return json.loads((directory / "genai_config.json").read_text())["model"]["decoder"]["head_size"]
    config = json.loads((directory / "config.json").read_text())
    return config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]


def session(path, threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def round_medians(paths: dict[str, str], threads: int, past: int, rounds: int, steps: int
                  ) -> dict[str, list[float]]:
    """label -> its median step (ms) in each of `rounds` rounds, sessions created in the order of `paths`."""
    sessions = {k: session(p, threads) for k, p in paths.items()}
    feeds = {k: decode_feed(s, Path(paths[k]).parent, past) for k, s in sessions.items()}
    medians: dict[str, list[float]] = {k: [] for k in sessions}
    labels = list(sessions)
    for round_ in range(rounds):
        # each round starts with another graph: the graph run first after another one measured up to 10% slower
        for k in labels[round_ % len(labels):] + labels[:round_ % len(labels)]:
            s = sessions[k]
            s.run(None, feeds[k])
            times = []
            for _ in range(steps):
                start = time.perf_counter()
                s.run(None, feeds[k])
                times.append(time.perf_counter() - start)
            medians[k].append(statistics.median(times) * 1000)
    return medians


def step_ms(paths: dict[str, str], threads: int = 1, past: int = 128, rounds: int = 3, steps: int = 15,
            squares: int = 4) -> dict[str, tuple[float, float]]:
    """label -> (median step ms, speedup over the first graph: median of per-round ratios). `squares` Latin
    squares of child processes (one per rotation of the session-creation order), `rounds` rounds in each child."""
    labels = list(paths)
    medians: dict[str, list[float]] = {k: [] for k in labels}
    for shift in [s for _ in range(squares) for s in range(len(labels))]:
        order = labels[shift:] + labels[:shift]
        child = subprocess.run(
            [sys.executable, __file__, "--child", json.dumps([threads, past, rounds, steps]),
             *(f"{k}={paths[k]}" for k in order)], check=True, capture_output=True, text=True)
        for k, values in json.loads(child.stdout.splitlines()[-1]).items():
            medians[k] += values
    reference = medians[labels[0]]
    return {k: (statistics.median(v), statistics.median(r / m for r, m in zip(reference, v))) for k, v in medians.items()}


if __name__ == "__main__":
    if sys.argv[1] == "--child":
        threads, past, rounds, steps = json.loads(sys.argv[2])
        print(json.dumps(round_medians(dict(a.split("=", 1) for a in sys.argv[3:]), threads, past, rounds, steps)))
        sys.exit()
    args = dict(a.split("=", 1) for a in sys.argv[1:])
    threads, squares = int(args.pop("threads", 1)), int(args.pop("squares", 4))
    for label, (ms, speedup) in step_ms(args, threads, squares=squares).items():
        print(f"{label:20s} {ms:8.3f} ms  x{speedup:.3f}")
