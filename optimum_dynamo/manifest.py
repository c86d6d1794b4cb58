"""The manifest written beside every export: which path produced it, versions, discrepancies."""

from __future__ import annotations

import importlib.metadata
import json
from typing import Any

MANIFEST_FILE = "optimum_dynamo.json"
_PACKAGES = ["optimum-dynamo", "torch", "transformers", "optimum", "optimum-onnx", "onnx", "onnxscript", "onnxruntime"]


def versions() -> dict[str, str]:
    found = {}
    for package in _PACKAGES:
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    return found


def component_record(part, files: list[str], static_axes: dict | None = None) -> dict[str, Any]:
    """What the manifest says of one component (one graph)."""
    from .validate import as_dicts

    args = part.arguments
    return {
        "files": files,
        "inputs": part.inputs_kept or args.input_names,
        "outputs": part.output_names,
        "dynamic_axes": {name: {str(a): label for a, label in axes.items()} for name, axes in args.axis_names.items()},
        "static_axes": static_axes or {},
        "calls_recorded": len(part.calls),
        "sample_call": args.sample_call,
        "contrib_ops": part.contrib_ops,
        "unfused": part.unfused,
        "discrepancies": as_dicts(part.discrepancies),
        **({"quantization": part.quantization} if part.quantization else {}),
    }


def write_manifest(ctx, records: dict[str, dict[str, Any]], **fields: Any) -> None:
    """`records`: component name -> `component_record`. One component: its record is the manifest's top level;
    several: under `components`, with every file and every discrepancy row (named by component) on top."""
    data = {
        "exporter": "dynamo",
        "model": ctx.model_id,
        "task": ctx.task.name if ctx.task else None,
        "dtype": ctx.options.dtype,
        "versions": versions(),
    }
    if len(records) == 1:
        data.update(next(iter(records.values())))
    else:
        data["files"] = list(dict.fromkeys(f for record in records.values() for f in record["files"]))  # shared once
        data["components"] = records
        data["discrepancies"] = [dict(row, component=name) for name, record in records.items()
                                 for row in record["discrepancies"]]
    data.update(fields, timings_s=ctx.timings)
    (ctx.staging / MANIFEST_FILE).write_text(json.dumps(data, indent=2) + "\n")


def runtime_of(task) -> str:
    """The runtime class that drives the export (optimum's; state graphs too, through legacy_bridge)."""
    return f"{task.spec.runtime_module}.{task.spec.runtime_class}" if task else ""


def write_fallback_manifest(directory, *, model: str, task: str, reason: str) -> None:
    """The manifest of an export the torchscript fallback produced."""
    from pathlib import Path

    data = {"exporter": "torchscript-fallback", "model": model, "task": task, "fallback_reason": reason,
            "versions": versions()}
    (Path(directory) / MANIFEST_FILE).write_text(json.dumps(data, indent=2) + "\n")


def read_manifest(directory) -> dict[str, Any]:
    from pathlib import Path

    return json.loads((Path(directory) / MANIFEST_FILE).read_text())
