"""A saved graph run by onnxruntime piece by piece, for graphs whose weights are streamed (docs: Big models).

The graph's nodes, in their saved (topological) order, are cut into pieces whose initializers take at most
`budget` bytes as onnxruntime's CPU kernels hold them (an fp16 or bf16 weight also as the fp32 copy they
compute with: three times its size). Each piece is a session of its own that reads its initializers from the
graph's external data file in place, without prepacking (a second copy of each weight in the kernel's layout;
kept for contrib operators such as MatMulNBits, whose prepacked kernels compute differently, as the runtime does);
every case runs through the first piece, then every case through the second, and so on: one piece's weights in
memory at a time, plus the values that cross the cuts (the activations of the validated calls). A MatMul whose
weight alone is over the budget (the head of a big vocabulary) runs in blocks of its weight's columns, read from
the file one block at a time. onnxruntime optimizes each piece alone, so a fusion across a cut is not made: the
numbers match the whole graph's to rounding.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Iterator, NamedTuple, Sequence

import numpy as np
import onnx
from tqdm.auto import tqdm

BUDGET = 128 * 2**20  # initializer bytes per piece


class Port(NamedTuple):
    """What a session's get_inputs()/get_outputs() give: name, shape (ints or dim names), type."""

    name: str
    shape: list
    type: str


def _port(info: onnx.ValueInfoProto) -> Port:
    tensor = info.type.tensor_type
    dims = [d.dim_param or (d.dim_value if d.HasField("dim_value") else None) for d in tensor.shape.dim]
    return Port(info.name, dims, f"tensor({onnx.helper.tensor_dtype_to_string(tensor.elem_type).split('.')[-1].lower()})")


HALF = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)  # computed in fp32 by the CPU kernels


def _nbytes(tensor: onnx.TensorProto) -> int:
    """Bytes onnxruntime holds for an initializer: its own, and for fp16/bf16 the fp32 copy too."""
    size = math.prod(tensor.dims) * np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    return 3 * size if tensor.data_type in HALF else size


def _names_used(node: onnx.NodeProto) -> set[str]:
    """Inputs of the node and the outer-scope names its subgraphs (If/Loop/Scan bodies) read."""
    used = {n for n in node.input if n}
    for attribute in node.attribute:
        for graph in [attribute.g] if attribute.HasField("g") else list(attribute.graphs):
            inner = {i.name for i in graph.input} | {t.name for t in graph.initializer}
            for child in graph.node:
                used |= _names_used(child) - inner
                inner |= set(child.output)
    return used


def cut(graph: onnx.GraphProto, budget: int) -> list[list[int]]:
    """Node indices per piece: consecutive nodes whose initializers take at most `budget` bytes."""
    sizes = {t.name: _nbytes(t) for t in graph.initializer}
    pieces, current, held, total = [], [], set(), 0
    for index, node in enumerate(graph.node):
        new = {n for n in _names_used(node) if n in sizes} - held
        extra = sum(sizes[n] for n in new)
        if current and total + extra > budget:
            pieces.append(current)
            current, held, total = [], set(), 0
            new = {n for n in _names_used(node) if n in sizes}
            extra = sum(sizes[n] for n in new)
        current.append(index)
        held |= new
        total += extra
    return pieces + [current] if current else pieces


class PiecewiseSession:
    """Runs the graph at `path` piece by piece (see the module's doc); `run_all` takes every case at once."""

    def __init__(self, path: Path, budget: int = BUDGET):
        self.model = onnx.load(str(path), load_external_data=False)
        self.folder = str(Path(path).parent.resolve())
        self.budget = budget
        self.pieces = cut(self.model.graph, budget)

    def get_inputs(self) -> list[Port]:
        return [_port(i) for i in self.model.graph.input]

    def get_outputs(self) -> list[Port]:
        return [_port(o) for o in self.model.graph.output]

    def run(self, output_names, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self.run_all([feed])[0]

    def run_all(self, feeds: Sequence[dict[str, np.ndarray]]) -> list[list[np.ndarray]]:
        """Every graph output for every feed (in the graph's output order)."""
        graph = self.model.graph
        names = {i.name for i in graph.input}
        values = [{k: v for k, v in feed.items() if k in names} for feed in feeds]
        used = [set().union(*(_names_used(graph.node[i]) for i in piece)) for piece in self.pieces]
        wanted = {o.name for o in graph.output}
        for number, piece in enumerate(tqdm(self.pieces, desc="validate", unit="piece", leave=False,
                                            disable=len(self.pieces) < 8)):
            later = wanted.union(*used[number + 1:])
            produced = {n for i in piece for n in graph.node[i].output if n}
            if (weight := self._oversized_weight(piece)) is not None:
                self._run_in_blocks(graph.node[piece[0]], weight, values)
            else:
                session = self._session(piece, used[number], produced, produced & later, values[0])
                outputs = [o.name for o in session.get_outputs()]
                inputs = [i.name for i in session.get_inputs()]
                for case in values:
                    case.update(zip(outputs, session.run(outputs, {n: case[n] for n in inputs})))
                del session  # memory: one piece's weights at a time
            for case in values:
                for name in set(case) - later:  # no later piece reads it
                    del case[name]
        return [[case[o.name] for o in graph.output] for case in values]

    def _oversized_weight(self, piece: list[int]) -> onnx.TensorProto | None:
        """The 2-D external weight of a MatMul that is a piece alone because the weight is over the budget."""
        node = self.model.graph.node[piece[0]]
        if len(piece) != 1 or node.op_type != "MatMul" or node.domain not in ("", "ai.onnx"):
            return None
        weight = next((t for t in self.model.graph.initializer if t.name == node.input[1]), None)
        blockable = weight is not None and weight.data_location == onnx.TensorProto.EXTERNAL and len(weight.dims) == 2
        floating = blockable and weight.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)
        return weight if floating and _nbytes(weight) > self.budget else None

    def _run_in_blocks(self, node: onnx.NodeProto, weight: onnx.TensorProto, values: list[dict]) -> None:
        """`node` (Y = MatMul(A, W)) for every case, W's columns read from the file in blocks of at most half the
        budget (as held), each block fed to a session of one MatMul as its input (not prepacked, cast per call)."""
        import onnxruntime as ort

        info = {entry.key: entry.value for entry in weight.external_data}
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(weight.data_type))
        rows, columns = weight.dims
        mapped = np.memmap(Path(self.folder) / info["location"], dtype, "r", int(info.get("offset", 0)),
                           (rows, columns))
        step = max(1, columns * self.budget // (2 * _nbytes(weight)))
        a, y = node.input[0], node.output[0]
        body = onnx.helper.make_graph(
            [onnx.helper.make_node("MatMul", [a, "block"], [y])], "block",
            [onnx.helper.make_tensor_value_info(a, onnx.helper.np_dtype_to_tensor_dtype(values[0][a].dtype), None),
             onnx.helper.make_tensor_value_info("block", weight.data_type, [rows, None])],
            [onnx.ValueInfoProto(name=y)])
        model = onnx.ModelProto(ir_version=self.model.ir_version, graph=body)
        model.opset_import.extend(o for o in self.model.opset_import if o.domain in ("", "ai.onnx"))
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        parts: list[list[np.ndarray]] = [[] for _ in values]
        for start in range(0, columns, step):
            block = np.ascontiguousarray(mapped[:, start:start + step])
            for case, out in zip(values, parts):
                out.extend(session.run([y], {a: case[a], "block": block}))
            del block
        del mapped
        for case, out in zip(values, parts):
            case[y] = np.concatenate(out, axis=-1)

    def _session(self, piece: list[int], used: set[str], produced: set[str], outputs: set[str],
                 example: dict[str, np.ndarray]):
        import onnxruntime as ort

        graph = self.model.graph
        initializers = [t for t in graph.initializer if t.name in used]
        declared = {i.name: i for i in graph.input}
        inputs = [declared.get(n) or onnx.helper.make_tensor_value_info(
            n, onnx.helper.np_dtype_to_tensor_dtype(example[n].dtype), None)
            for n in sorted(used - produced - {t.name for t in initializers})]
        order = [o.name for o in graph.output if o.name in outputs] + sorted(outputs - {o.name for o in graph.output})
        body = onnx.helper.make_graph([graph.node[i] for i in piece], graph.name, inputs,
                                      [onnx.ValueInfoProto(name=n) for n in order], initializers)
        model = onnx.ModelProto(ir_version=self.model.ir_version, graph=body)
        model.opset_import.extend(self.model.opset_import)
        model.functions.extend(self.model.functions)
        options = ort.SessionOptions()
        options.add_session_config_entry("session.model_external_initializers_file_folder_path", self.folder)
        if all(graph.node[i].domain in ("", "ai.onnx") for i in piece):  # contrib kernels (MatMulNBits) compute
            options.add_session_config_entry("session.disable_prepacking", "1")  # otherwise unpacked: as run
        return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def run_cases(session, feeds: Sequence[dict[str, np.ndarray]]) -> Iterator[list[np.ndarray]]:
    """Every output of `session` for each feed: all at once for a piecewise session, else call by call."""
    if hasattr(session, "run_all"):
        yield from session.run_all(feeds)
        return
    for feed in tqdm(feeds, desc="validate", unit="call", leave=False, disable=len(feeds) < 8):
        yield session.run(None, feed)


__all__ = ["BUDGET", "PiecewiseSession", "cut", "run_cases"]
