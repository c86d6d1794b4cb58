"""Graphs of one export that hold the same weights (a vision-language model's step graphs: the prompt's, the decode
step's, those of prompts without an image) read them from one external-data file: each distinct tensor is stored
once, and every graph's external references point into that file.

onnxruntime resolves external data relative to the graph's own directory and refuses paths that leave it, so the
graphs sharing a file sit in one directory. Tensors are matched by their bytes (a weight and the same weight under
another name in another graph are one tensor on disk).
"""

from __future__ import annotations

import hashlib
from pathlib import Path, PurePosixPath

import onnx

from .onnx import onnx_files

ALIGNMENT = 4096  # page-aligned offsets, as onnx aligns large external tensors, so that a runtime can map them


def _external_tensors(graph: onnx.GraphProto):
    """Initializers stored outside the graph, subgraphs included."""
    for tensor in graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            yield tensor
    for node in graph.node:
        for attribute in node.attribute:
            for subgraph in [attribute.g] if attribute.HasField("g") else list(attribute.graphs):
                yield from _external_tensors(subgraph)


def _read(directory: Path, tensor: onnx.TensorProto) -> bytes:
    info = {entry.key: entry.value for entry in tensor.external_data}
    with open(directory / info["location"], "rb") as source:
        source.seek(int(info.get("offset", 0)))
        return source.read(int(info["length"]))


def share_weights(directory: Path, graphs: list[str], target: str) -> int:
    """Rewrite `graphs` (file names in `directory`, each with its own external data) to read their external tensors
    from `target` in `directory`, one copy of each; their own data files are removed. Returns the bytes written."""
    stored: dict[bytes, tuple[int, int]] = {}
    written = directory / f"{target}.partial"  # `target` may be one of the graphs' own files, read until the end
    with open(written, "wb") as out:
        for name in graphs:
            proto = onnx.load(directory / name, load_external_data=False)
            sources = set()
            for tensor in _external_tensors(proto.graph):
                sources.add(next(e.value for e in tensor.external_data if e.key == "location"))
                data = _read(directory, tensor)
                key = hashlib.blake2b(data, digest_size=32).digest()
                if key not in stored:
                    out.write(b"\0" * (-out.tell() % ALIGNMENT))
                    stored[key] = (out.tell(), len(data))
                    out.write(data)
                offset, length = stored[key]
                del tensor.external_data[:]
                for field, value in (("location", target), ("offset", str(offset)), ("length", str(length))):
                    tensor.external_data.add(key=field, value=value)
            onnx.save(proto, directory / name)
            for source in sources - {target}:
                (directory / source).unlink()
        size = out.tell()
    written.replace(directory / target)
    return size


def share_component_weights(staging: Path, parts: list, target: str) -> None:
    """`share_weights` over the graphs of `parts` (components whose graphs sit in `target`'s directory, relative to
    `staging`); each part then names `target`'s file as its weights (the manifest lists that file once)."""
    target = PurePosixPath(target)
    share_weights(staging / target.parent, [PurePosixPath(onnx_files(part)[0]).name for part in parts], target.name)
    for part in parts:
        part.weights = target.name


__all__ = ["share_component_weights", "share_weights"]
