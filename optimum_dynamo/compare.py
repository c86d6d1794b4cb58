"""Export one model with both exporters (torchscript and dynamo) and show how far each export is from
PyTorch, on the same inputs, through optimum's runtime class.

    python -m optimum_dynamo.compare --model DIR [--task TASK] [--output DIR] [--new-tokens N]

For text generation the runtime class and PyTorch both greedy-generate from a left-padded batch; the
table gives the largest logits difference at the first step (empty cache) and over the later steps
(with cache), and whether the tokens are equal. Other tasks compare every output of one forward.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .errors import describe

EXPORTERS = ("torchscript", "dynamo")
_TEXTS = ["hello world", "the quick brown fox jumps over the lazy dog"]


@dataclass
class Row:
    exporter: str
    status: str  # "ok" or "failed: <one line>"
    export_s: float | None = None
    nodes: int | None = None
    first_step: float | None = None  # max |ORT - PyTorch| of the first step's outputs
    later_steps: float | None = None  # max over the later (cached) steps; None without generation
    tokens_equal: bool | None = None


def _inputs(checkpoint: str, config):
    import torch
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(checkpoint)
        tokenizer.padding_side = "left"
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
        batch = tokenizer(_TEXTS, return_tensors="pt", padding=True)
        if int(batch["input_ids"].max()) < config.vocab_size:
            return {k: batch[k] for k in ("input_ids", "attention_mask")}
    except Exception:  # no usable tokenizer: random ids, one left-padded row
        pass
    ids = torch.randint(3, config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    return {"input_ids": ids, "attention_mask": mask}


def _max_diff(a, b) -> float:
    return float((a.float() - b.float()).abs().max()) if a.numel() else 0.0


def _measure(row: Row, runtime, torch_model, inputs, generation: bool, new_tokens: int) -> None:
    import torch

    if generation:
        pad = torch_model.generation_config.pad_token_id
        options = dict(do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                       pad_token_id=0 if pad is None else pad, output_logits=True, return_dict_in_generate=True)
        with torch.no_grad():
            ort = runtime.generate(**inputs, **options)
            ref = torch_model.generate(**inputs, **options)
        diffs = [_max_diff(a, b) for a, b in zip(ort.logits, ref.logits)]
        row.first_step, row.later_steps = diffs[0], max(diffs[1:], default=0.0)
        row.tokens_equal = torch.equal(ort.sequences, ref.sequences)
        return
    with torch.no_grad():
        ort, ref = runtime(**inputs), torch_model(**inputs)
    keys = [k for k in ref.keys() if k in ort.keys() and torch.is_tensor(ref[k])]
    row.first_step = max((_max_diff(ort[k], ref[k]) for k in keys), default=None)


def _export(exporter: str, checkpoint: str, output: Path, task: str, trust_remote_code: bool) -> None:
    if exporter == "dynamo":
        from .exporters import export_onnx

        export_onnx(checkpoint, output, task=task, trust_remote_code=trust_remote_code)
    else:
        from legacy_bridge.torchscript import export_torchscript

        from .quiet import third_party
        from .staging import staged

        with staged(output) as staging, third_party(also=("optimum", "transformers"), all_warnings=True):
            export_torchscript(checkpoint, staging, task, trust_remote_code=trust_remote_code, do_validation=False)


def compare_exporters(checkpoint, task: str | None = None, output=None, new_tokens: int = 4,
                      trust_remote_code: bool = False) -> list[Row]:
    """Export `checkpoint` with both exporters under `output` (a temporary dir if None) and measure
    each export against PyTorch; an exporter that fails gets a row saying why."""
    import onnx
    from transformers import AutoConfig

    from .quiet import third_party
    from .tasks import resolve_task

    checkpoint = str(checkpoint)
    config = AutoConfig.from_pretrained(checkpoint, trust_remote_code=trust_remote_code)
    resolved = resolve_task(task, checkpoint, config)
    generation = resolved.base == "text-generation"
    auto_class = _auto_class(resolved.base)
    with third_party(also=("transformers",)):
        torch_model = auto_class.from_pretrained(checkpoint, trust_remote_code=trust_remote_code).eval()
    inputs = _inputs(checkpoint, config)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(output) if output is not None else Path(tmp)
        for exporter in EXPORTERS:
            out, row = root / exporter, Row(exporter, "ok")
            try:
                start = time.perf_counter()
                _export(exporter, checkpoint, out, resolved.name, trust_remote_code)
                row.export_s = round(time.perf_counter() - start, 1)
                row.nodes = len(onnx.load(str(out / "model.onnx"), load_external_data=False).graph.node)
                runtime = resolved.runtime_class().from_pretrained(out, use_cache=resolved.with_past) if generation \
                    else resolved.runtime_class().from_pretrained(out)
                _measure(row, runtime, torch_model, inputs, generation, new_tokens)
            except Exception as e:  # one exporter failing is a result, not the end of the comparison
                row.status = f"failed: {describe(e, limit=160)}"
            rows.append(row)
    return rows


def _auto_class(base_task: str):
    from optimum.exporters.tasks import TasksManager

    return TasksManager.get_model_class_for_task(base_task, library="transformers")


def table(rows: list[Row]) -> str:
    def num(x):
        return "-" if x is None else f"{x:.2e}"

    lines = [f"{'exporter':<12} {'export s':>8} {'nodes':>6} {'first step':>11} {'later steps':>11} {'tokens':>7}  status"]
    for r in rows:
        tokens = "-" if r.tokens_equal is None else ("equal" if r.tokens_equal else "DIFFER")
        lines.append(f"{r.exporter:<12} {'-' if r.export_s is None else r.export_s:>8} {'-' if r.nodes is None else r.nodes:>6} "
                     f"{num(r.first_step):>11} {num(r.later_steps):>11} {tokens:>7}  {r.status}")
    return "\n".join(lines)


def main(argv=None) -> int:
    import optimum_dynamo  # noqa: F401  (the bridge before optimum is imported)

    from .quiet import configure_cli, logger

    parser = argparse.ArgumentParser(prog="python -m optimum_dynamo.compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="checkpoint directory or hub id")
    parser.add_argument("--task", default=None, help="optimum task (inferred when omitted)")
    parser.add_argument("--output", default=None, help="keep both exports here (OUTPUT/torchscript, OUTPUT/dynamo)")
    parser.add_argument("--new-tokens", type=int, default=4, help="greedy tokens generated (text generation)")
    parser.add_argument("--trust-remote-code", action="store_true")
    parser.add_argument("-v", "--verbose", action="store_true", help="show the exporters' own lines")
    args = parser.parse_args(argv)
    configure_cli(args.verbose)
    if not args.verbose:  # the table is the result; the exporters' stage lines are not
        logger().setLevel(logging.WARNING)
    rows = compare_exporters(args.model, args.task, args.output, args.new_tokens, args.trust_remote_code)
    print("max |onnxruntime - PyTorch|, same inputs, optimum's runtime class:")
    print(table(rows))
    return 0 if all(r.status == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
