"""Decode-step latency of an exported decoder: batch 1, one new token over a given past, onnxruntime CPU."""

from __future__ import annotations

import time

import numpy as np


def decode_feed(session, past: int = 128, batch: int = 1) -> dict[str, np.ndarray]:
    """Inputs of one decode step: one new token after `past` cached positions (random cache values)."""
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
            feed[name] = rng.standard_normal((batch, heads, past, head_dim)).astype(np.float32)
        else:
            raise ValueError(f"unexpected input {name}")
    return feed


def session(path, threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def step_ms(paths: dict[str, str], threads: int = 1, past: int = 128, rounds: int = 20, steps: int = 20) -> dict[str, float]:
    """Min single-step time (ms) per graph over `rounds` x `steps` runs; graphs alternate between rounds, so
    every graph sees the same machine load (the min is the least disturbed step on a shared machine)."""
    sessions = {k: session(p, threads) for k, p in paths.items()}
    feeds = {k: decode_feed(s, past) for k, s in sessions.items()}
    best = {k: float("inf") for k in sessions}
    for _ in range(rounds):
        for k, s in sessions.items():
            s.run(None, feeds[k])
            for _ in range(steps):
                start = time.perf_counter()
                s.run(None, feeds[k])
                best[k] = min(best[k], (time.perf_counter() - start) * 1000)
    return best


if __name__ == "__main__":
    import sys

    args = dict(a.split("=", 1) for a in sys.argv[1:])
    threads = int(args.pop("threads", 1))
    result = step_ms(args, threads)
    base = next(iter(result.values()))
    for k, v in result.items():
        print(f"{k:20s} {v:8.3f} ms  x{base / v:.3f}")
