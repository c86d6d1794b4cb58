"""ONNX backend: torch.export program -> ONNX with optimum's names, in optimum's layout.

Stages after the shared ones: translate -> name inputs/outputs -> optimize -> save ->
copy configs -> validate -> manifest.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import onnx_ir as ir
import torch

from ..errors import PipelineError
from ..flatten import flat_outputs
from ..manifest import runtime_of, write_manifest
from ..quiet import is_verbose
from ..validate import as_dicts, compare, gate, table
from .base import ExportContext, Exporter, stage
from .onnx_optimize import contrib_ops, default_opset, optimize
from .pt2 import write_artifacts

logger = logging.getLogger(__name__)

ONNX_FILE = "model.onnx"
ONNX_DATA = "model.onnx_data"  # optimum's name for external weights
WARN_ABOVE = 1e-3  # without --atol, a larger difference is reported as a warning
# Per --dtype (ONNX Runtime CPU against PyTorch in that dtype): fp16 rounds each op's result to 11 bits.
WARN_ABOVE_DTYPE = {"fp32": WARN_ABOVE, "fp16": 2e-2}


def warn_above(options: dict) -> float:
    return WARN_ABOVE_DTYPE[options.get("dtype") or "fp32"]
_SYMBOL = re.compile(r"\b[su]\d+\b")


def rename_io(model: ir.Model, input_names, axis_names, output_names) -> None:
    """Set optimum's input/output names and name every dynamic axis."""
    graph = model.graph
    if len(graph.inputs) != len(input_names) or len(graph.outputs) != len(output_names):
        raise PipelineError(
            f"graph has {len(graph.inputs)} inputs / {len(graph.outputs)} outputs, "
            f"expected {len(input_names)} / {len(output_names)}"
        )
    symbols: dict[str, str] = {}
    for value, name in zip(graph.inputs, input_names):
        value.name = name
        dims = list(value.shape)
        for axis, label in axis_names.get(name, {}).items():
            if isinstance(dims[axis], ir.SymbolicDim) and dims[axis].value:
                symbols.setdefault(dims[axis].value, label)
            dims[axis] = ir.SymbolicDim(label)
        value.shape = ir.Shape(dims)

    def rename(dim):
        if not isinstance(dim, ir.SymbolicDim) or not dim.value:
            return dim
        tokens = _SYMBOL.findall(dim.value)
        if tokens and all(t in symbols for t in tokens):
            return ir.SymbolicDim(_SYMBOL.sub(lambda m: symbols[m.group(0)], dim.value))
        return dim

    seen: set[int] = set()
    for index, name in enumerate(output_names):
        value = graph.outputs[index]
        if id(value) in seen or value.is_graph_input():  # one tensor, two outputs (last_hidden_state is
            value = _copy(graph, value)                  # hidden_states[-1]): each name gets its own value
            graph.outputs[index] = value
        seen.add(id(value))
        value.name = name
        if value.shape is not None:
            value.shape = ir.Shape([rename(d) for d in value.shape])


def _copy(graph: ir.Graph, value: ir.Value) -> ir.Value:
    node = ir.Node("", "Identity", inputs=[value], num_outputs=1)
    graph.append(node)
    copy = node.outputs[0]
    copy.shape, copy.type = value.shape, value.type
    return copy


class OnnxExporter(Exporter):
    backend = "onnx"

    @stage("write .pt2 files")
    def pt2(self, ctx: ExportContext) -> None:
        if not (ctx.options.get("pt2") or ctx.options.get("aoti")):
            return
        ctx.manifest["pt2"] = write_artifacts(ctx.program, ctx.model, ctx.arguments.kwargs, ctx.staging,
                                              pt2=bool(ctx.options.get("pt2")), aoti=bool(ctx.options.get("aoti")),
                                              atol=ctx.options.get("atol"))

    @stage("translate to ONNX")
    def translate(self, ctx: ExportContext) -> None:
        ctx.onnx_program = translate_program(ctx.program, ctx.options)
        ctx.program = None  # memory: the ONNX model is what is kept

    @stage("name inputs and outputs")
    def name_io(self, ctx: ExportContext) -> None:
        sample = ctx.observer.calls[ctx.arguments.sample_call]
        ctx.output_names = list(flat_outputs(sample.outputs))
        rename_io(ctx.onnx_program.model, ctx.arguments.input_names, ctx.arguments.axis_names, ctx.output_names)

    @stage("optimize")
    def optimize(self, ctx: ExportContext) -> None:
        optimize_graph(ctx.onnx_program.model, ctx.options)

    @stage("save")
    def save(self, ctx: ExportContext) -> None:
        ctx.manifest["contrib_ops"] = contrib_ops(ctx.onnx_program.model)
        save_graph(ctx.onnx_program.model, ctx.staging, (ONNX_FILE, ONNX_DATA), ctx.options)
        ctx.onnx_program = None  # memory: validation loads the saved file; one copy of the weights at a time

    @stage("copy configs and tokenizer")
    def copy_files(self, ctx: ExportContext) -> None:
        copy_files(ctx)

    @stage("validate with onnxruntime")
    def validate(self, ctx: ExportContext) -> None:
        if ctx.options.get("validate") is False:  # do_validation=False
            logger.info("    skipped (do_validation=False)")
            return
        ctx.discrepancies = validate_graph(ctx.staging / ONNX_FILE, ctx.observer.calls, ctx.arguments,
                                           ctx.output_names, ctx.model, ctx.options)

    @stage("write manifest")
    def manifest(self, ctx: ExportContext) -> None:
        write_manifest(
            ctx,
            backend=self.backend,
            files=[ONNX_FILE, ONNX_DATA],
            inputs=ctx.arguments.input_names,
            outputs=ctx.output_names,
            runtime=runtime_of(ctx.task, ctx.output_names),
            dtype=ctx.options.get("dtype") or "fp32",
            optimize_level=ctx.options.get("optimize_level"),
            contrib_ops=ctx.manifest.get("contrib_ops", {}),
            programs=ctx.manifest.get("pt2", {}),
            discrepancies=as_dicts(ctx.discrepancies),
        )


# ── One graph's ONNX steps: every exporter (decoder, encoder-decoder components) runs these ──


def translate_program(program: torch.export.ExportedProgram, options: dict):
    """torch.onnx's translation (no optimization: `optimize_graph` does it); the opset follows --opset,
    else what --optimize needs."""
    opset = options.get("opset") or default_opset(options.get("optimize_level"))
    onnx_program = torch.onnx.export(program, dynamo=True, optimize=False, opset_version=opset,
                                     verbose=None if is_verbose() else False)
    onnx_program.exported_program = None  # memory: the ONNX model is what is kept
    return onnx_program


def optimize_graph(model: ir.Model, options: dict) -> None:
    """The graph optimizer (`onnx_optimize.optimize`) at --optimize's level; none with --no-constant-folding."""
    if options.get("optimize", True):
        optimize(model, options.get("optimize_level"))


def save_graph(model: ir.Model, directory: Path, files: tuple[str, str], options: dict) -> None:
    """`files` = (graph file, external weights file) in `directory`; then --slim."""
    ir.save(model, directory / files[0], external_data=files[1])
    if options.get("slim"):
        slim(directory / files[0], files[1])


def validate_graph(path: Path, calls, arguments, output_names, module, options: dict, graph: str = "",
                   session=None) -> list:
    """onnxruntime vs PyTorch (`module`) on the captured `calls`: the table logged, --atol enforced.
    `session(ort_session)`: a wrapper feeding the session (e.g. only the inputs its graph kept)."""
    import onnxruntime as ort

    loaded = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rows = compare(session(loaded) if session else loaded, calls, arguments, output_names, module,
                   options.get("fill"))
    logger.info("    %sonnxruntime vs PyTorch on %d calls:\n%s", f"{graph}: " if graph else "", len(calls), table(rows))
    gate(rows, options.get("atol"), warn_above(options), graph)
    return rows


def slim(path: Path, data: str) -> None:
    """--slim: onnxslim over the saved graph (only offered when onnxslim is installed; see flags.py)."""
    import onnx
    import onnxslim

    model = onnxslim.slim(onnx.load(str(path)))
    (path.parent / data).unlink()
    onnx.save(model, str(path), save_as_external_data=True, location=data)


def copy_files(ctx: ExportContext) -> None:
    """config.json, generation_config.json, and the checkpoint's own preprocessor files as they are (never
    a file the checkpoint does not have, nor one changed by capture, e.g. its padding side)."""
    import shutil

    from .base import preprocessor_files

    ctx.model.config.save_pretrained(ctx.staging)
    if getattr(ctx.model, "generation_config", None) is not None and ctx.model.can_generate():
        ctx.model.generation_config.save_pretrained(ctx.staging)
    if ctx.tokenizer is None and getattr(ctx, "processor", None) is None:
        return
    kwargs = ctx.options.get("hub_options", {})
    local = Path(ctx.model_id) / (kwargs.get("subfolder") or "")
    for name in preprocessor_files(ctx.model_id, kwargs):
        if local.is_dir():
            shutil.copyfile(local / name, ctx.staging / name)
        else:
            from huggingface_hub import hf_hub_download

            shutil.copyfile(hf_hub_download(ctx.model_id, name, **{k: v for k, v in kwargs.items() if k in (
                "subfolder", "revision", "cache_dir", "token", "force_download", "local_files_only")}), ctx.staging / name)


__all__ = ["ONNX_DATA", "ONNX_FILE", "OnnxExporter", "copy_files", "optimize_graph", "rename_io",
           "save_graph", "translate_program", "validate_graph", "warn_above"]
