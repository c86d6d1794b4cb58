"""ONNX backend: torch.export program -> ONNX with optimum's names, in optimum's layout.

Stages after the shared ones: translate -> name inputs/outputs -> optimize -> (quantize) -> save ->
copy configs -> validate -> manifest.
"""

from __future__ import annotations

import fnmatch
import logging
import re
import shutil
from pathlib import Path

import onnx_ir as ir
import torch

from ..errors import ExportError, PipelineError
from ..flatten import flat_outputs
from ..manifest import component_record, runtime_of, write_manifest
from ..quiet import is_verbose
from ..flags import DTYPES
from ..streaming import attach
from ..options import FUSED_LEVELS, ExportOptions
from ..validate import compare, gate, quantized, references, table
from ..validate.generate import check_generate
from ..validate.piecewise import BUDGET, PiecewiseSession
from .base import OFFLOAD, ExportContext, Exporter, release_weights, stage
from .component import Component
from . import translations
from .onnx_optimize import contrib_ops, default_opset, fused, optimize, share_input_dims, unfused
from .onnx_passes.inverse_dft import WholeSpectrumInverseDFT
from .onnx_passes.quantize import QuantizeWeights, Scheme
from .pt2 import write_artifacts

logger = logging.getLogger(__name__)

ONNX_FILE = "model.onnx"
ONNX_DATA = "model.onnx_data"  # optimum's name for external weights
FP32_DIR = ".fp32"  # in staging: the graph before --quantize, for validation (removed after it)

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
    share_input_dims(graph)


def _copy(graph: ir.Graph, value: ir.Value) -> ir.Value:
    node = ir.Node("", "Identity", inputs=[value], num_outputs=1)
    graph.append(node)
    copy = node.outputs[0]
    copy.shape, copy.type = value.shape, value.type
    return copy


class OnnxExporter(Exporter):
    backend = "onnx"

    @stage("write .pt2 files", when=lambda options: options.pt2 or options.aoti)
    def pt2(self, ctx: ExportContext) -> None:
        part = ctx.only  # the entry point refuses --pt2/--aoti for exports of several graphs
        ctx.manifest["pt2"] = write_artifacts(part.program, part, ctx.staging, pt2=ctx.options.pt2,
                                              aoti=ctx.options.aoti, atol=ctx.options.atol, fill=ctx.options.fill)

    @stage("translate to ONNX")
    def translate(self, ctx: ExportContext) -> None:
        for part in ctx.components:
            part.onnx_program = translate_program(part.program, ctx.options)
            part.program = None  # memory: the ONNX model is what is kept
            if ctx.streamed:
                attach(part.onnx_program.model, ctx.model, getattr(torch, DTYPES[ctx.options.dtype]))

    @stage("name inputs and outputs")
    def name_io(self, ctx: ExportContext) -> None:
        for part in ctx.components:
            names = list(flat_outputs(part.calls[part.arguments.sample_call].outputs))
            graph = part.onnx_program.model.graph
            if len(graph.outputs) != len(names):
                label = self.graph_label(ctx, part)
                raise PipelineError(f"{label + ': ' if label else ''}graph has {len(graph.outputs)} outputs, "
                                    f"expected {len(names)}")
            # drop before naming: a dropped output may be an input passed through (the cross cache)
            kept = [(value, name) for value, name in zip(graph.outputs, names) if _kept(name, part.keep)]
            graph.outputs.clear()
            graph.outputs.extend(value for value, _ in kept)
            part.output_names = [name for _, name in kept]
            rename_io(part.onnx_program.model, part.arguments.input_names, part.arguments.axis_names, part.output_names)

    @stage("optimize")
    def optimize(self, ctx: ExportContext) -> None:
        for part in ctx.components:
            part.onnx_program.model = optimize_graph(part.onnx_program.model, ctx.options)
            if ctx.options.optimize_level in FUSED_LEVELS:
                model = part.onnx_program.model
                logger.info("    fused: %s; not matched: %s (why: the manifest's `unfused`, or -v)",
                            ", ".join(f"{k} {v}" for k, v in fused(model).items()) or "none",
                            ", ".join(unfused(model)) or "none")
            graph = part.onnx_program.model.graph  # e.g. the encoder's states once the cross cache is given
            for value in [v for v in graph.inputs if v.name in part.drop_unused and not v.uses()]:
                graph.inputs.remove(value)

    @stage("quantize weights", when=lambda options: options.quantize)
    def quantize(self, ctx: ExportContext) -> None:
        for part in ctx.components:
            if quantized.LOGITS not in part.output_names:
                raise ExportError(f"--quantize: the graph has no {quantized.LOGITS!r} output to validate the quantized "
                                  "weights by (decoder and classification tasks); drop --quantize")
            model = part.onnx_program.model
            if ctx.options.validate and not ctx.streamed:  # the fp32 graph, to validate before and compare with after
                save_graph(model, ctx.staging / FP32_DIR, tuple(onnx_files(part)), ctx.options.replace(slim=False))
            part.quantization = quantize_weights(model, ctx.options)
            logger.info("    %d weights in %d bits, kept: %s", part.quantization["quantized"],
                        part.quantization["bits"], ", ".join(part.quantization["kept"]) or "none")

    @stage("save")
    def save(self, ctx: ExportContext) -> None:
        for part in ctx.components:
            model = part.onnx_program.model
            model.metadata_props.update(part.metadata)
            part.contrib_ops, part.unfused = contrib_ops(model), unfused(model)
            part.inputs_kept = [v.name for v in model.graph.inputs]
            save_graph(model, ctx.staging, tuple(onnx_files(part)), ctx.options)
            # memory: validation loads the saved file. The graph outlives this stage (onnxscript's rewrite rules
            # keep the last graph they matched), so its tensors (weights folded into new arrays) are dropped here.
            for value in model.graph.initializers.values():
                value.const_value = None
            part.onnx_program = None

    @stage("copy configs and tokenizer")
    def copy_files(self, ctx: ExportContext) -> None:
        copy_files(ctx)

    @stage("validate with onnxruntime", when=lambda options: options.validate)  # do_validation=False
    def validate(self, ctx: ExportContext) -> None:
        cases = [references(part.calls, part.arguments, part.module, ctx.options.fill) for part in ctx.components]
        release_weights(ctx)  # memory: PyTorch is not run again; the sessions load their own copy
        for part, found in zip(ctx.components, cases):
            path, label = ctx.staging / onnx_files(part)[0], self.graph_label(ctx, part)
            session = GraphInputs if part.drop_unused and not ctx.streamed else None  # pieces take what they read
            if part.quantization and ctx.streamed:  # no fp32 graph was written: judged against PyTorch
                part.quantization["validation"] = validate_quantized(path, None, found, part.arguments,
                                                                     part.quantization["bits"], label, True)
            elif part.quantization:  # the fp32 graph is validated as usual, the quantized one against it
                fp32 = open_session(ctx.staging / FP32_DIR / onnx_files(part)[0])
                part.discrepancies = validate_graph(fp32, found, part.arguments, part.output_names, ctx.options,
                                                    label, session)
                reference = quantized.logits_of(fp32, found, part.arguments.input_names)
                del fp32  # memory: one session at a time
                part.quantization["validation"] = validate_quantized(path, reference, found, part.arguments,
                                                                     part.quantization["bits"], label)
            else:
                part.discrepancies = validate_graph(path, found, part.arguments, part.output_names, ctx.options,
                                                    label, session, ctx.streamed, part.random_draws)
        shutil.rmtree(ctx.staging / FP32_DIR, ignore_errors=True)
        if ctx.streamed and ctx.generations:
            logger.info("    generate not compared: the runtime would hold the whole graph (weights streamed)")
        # an explicit --atol decides alone (a looser one writes a graph the gross rule would refuse): no token check
        elif ctx.generations and ctx.options.dtype == "fp32" and not ctx.options.quantize and ctx.options.atol is None:
            logger.info("    %s", check_generate(ctx.task.runtime_class(), ctx.staging, ctx.generations,
                                                 ctx.task.with_past))

    @stage("write manifest")
    def manifest(self, ctx: ExportContext) -> None:
        shutil.rmtree(ctx.staging / OFFLOAD, ignore_errors=True)
        records = {part.name: component_record(part, onnx_files(part), static_axes(ctx.model, part))
                   for part in ctx.components}
        write_manifest(
            ctx,
            records,
            backend=self.backend,
            runtime=runtime_of(ctx.task),
            optimize_level=ctx.options.optimize_level,
            **({"weights": "streamed from the checkpoint"} if ctx.streamed else {}),
            **({"programs": ctx.manifest.get("pt2", {})} if len(records) == 1 else {}),
        )


def onnx_files(part: Component) -> list[str]:
    """A component's graph and external weights (optimum's names), relative to the output directory."""
    stem = part.stem or ("model" if part.directory else part.name)
    return [part.path(f"{stem}.onnx"), part.path(part.weights or f"{stem}.onnx_data")]


def _kept(name: str, keep: str) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in keep.split(","))


def static_axes(model, part: Component) -> dict[str, dict[str, str]]:
    """Axes of encoder features that stay static, with the reason (Whisper takes a fixed number of frames)."""
    frames = getattr(getattr(model, "config", None), "max_source_positions", None)
    found = {}
    for name in part.arguments.input_names:
        if name == "input_features" and frames is not None:
            shape = part.arguments.shapes[name][0]
            axis = len(shape) - 1
            if axis not in part.arguments.axis_names.get(name, {}):
                found[name] = {str(axis): f"{model.config.model_type}'s encoder takes exactly {shape[axis]} frames "
                               f"(2 x max_source_positions = {2 * frames}); pad or cut features to that length"}
    return found


class GraphInputs:
    """A session fed only the inputs its graph kept (see `Component.drop_unused`)."""

    def __init__(self, session):
        self.session, self._names = session, {i.name for i in session.get_inputs()}

    def get_outputs(self):
        return self.session.get_outputs()

    def run(self, outputs, feed):
        return self.session.run(outputs, {k: v for k, v in feed.items() if k in self._names})


# ── One graph's ONNX steps: every exporter (decoder, encoder-decoder components) runs these ──


def translate_program(program: torch.export.ExportedProgram, options: ExportOptions):
    """torch.onnx's translation (no optimization: `optimize_graph` does it), with the ops it lacks
    (`translations`) and its irfft mended (`onnx_passes.inverse_dft`); the opset follows --opset, else what
    --optimize needs."""
    opset = options.opset or default_opset(options.optimize_level)
    keep_rank_squeezes(program)
    drop_tensor_asserts(program)
    cast_before_scalar_rsub(program)
    onnx_program = torch.onnx.export(program, dynamo=True, optimize=False, opset_version=opset,
                                     custom_translation_table=translations.TABLE,
                                     verbose=None if is_verbose() else False)
    WholeSpectrumInverseDFT()(onnx_program.model)
    onnx_program.exported_program = None  # memory: the ONNX model is what is kept
    return onnx_program


_SQUEEZES = (torch.ops.aten.squeeze.dim, torch.ops.aten.squeeze.dims)
_ASSERTS = (torch.ops.aten._assert_async.default, torch.ops.aten._assert_async.msg, torch.ops.aten._assert_scalar.default)


def drop_tensor_asserts(program: torch.export.ExportedProgram) -> None:
    """Drop the checks of `torch._check_tensor_all` (`_is_all_true(x)`, read by `.item()`, ending in asserts; T5Gemma
    2's image token count): ONNX has no assertion, and torch.onnx translates no `_is_all_true`."""
    graph = program.graph_module.graph
    for node in [n for n in graph.nodes if n.target is torch.ops.aten._is_all_true.default]:
        reached, todo = {node}, [node]
        while todo:
            for user in todo.pop().users:
                if user not in reached:
                    reached.add(user)
                    todo.append(user)
        if all(n.users or n.target in _ASSERTS for n in reached):  # only asserts read it
            for dropped in reversed([n for n in graph.nodes if n in reached]):
                graph.erase_node(dropped)


def keep_rank_squeezes(program: torch.export.ExportedProgram) -> None:
    """Drop `squeeze` nodes that squeezed nothing when traced (a dynamic axis, taken as not 1): the program's
    shapes keep that axis, but ONNX's Squeeze would fail (or drop it) at run time (Mistral 3's image rows)."""
    graph = program.graph_module.graph
    for node in list(graph.nodes):
        source = node.args[0] if node.target in _SQUEEZES else None
        if source is None or any(user.op == "output" for user in node.users):
            continue
        before, after = source.meta.get("val"), node.meta.get("val")
        if isinstance(before, torch.Tensor) and isinstance(after, torch.Tensor) and before.dim() == after.dim():
            node.replace_all_uses_with(source)
            graph.erase_node(node)
    program.graph_module.recompile()


def cast_before_scalar_rsub(program: torch.export.ExportedProgram) -> None:
    """`number - tensor` of integers and a float (XLNet's `1.0 - attention_mask`): torch.onnx's decompositions fail
    on it (torch 2.13 to 2.15); the integers are cast to the result's dtype first, which the subtraction does too."""
    graph = program.graph_module.graph
    for node in [n for n in graph.nodes if n.target is torch.ops.aten.rsub.Scalar]:
        source, result = node.args[0], node.meta.get("val")
        before = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
        if not isinstance(before, torch.Tensor) or not isinstance(result, torch.Tensor) or before.dtype == result.dtype:
            continue
        with graph.inserting_before(node):
            cast = graph.call_function(torch.ops.aten._to_copy.default, (source,), {"dtype": result.dtype})
        cast.meta["val"] = before.to(result.dtype)
        node.replace_input_with(source, cast)
    program.graph_module.recompile()


def optimize_graph(model: ir.Model, options: ExportOptions) -> ir.Model:
    """The graph optimizer (`onnx_optimize.optimize`) at --optimize's level; none with --no-constant-folding."""
    return optimize(model, options.optimize_level) if options.optimize else model


def save_graph(model: ir.Model, directory: Path, files: tuple[str, str], options: ExportOptions) -> None:
    """`files` = (graph file, external weights file beside it), relative to `directory`; then --slim."""
    path = directory / files[0]
    path.parent.mkdir(parents=True, exist_ok=True)
    ir.save(model, path, external_data=Path(files[1]).name)
    if options.slim:
        slim(path, Path(files[1]).name)


def open_session(path: Path, streamed: bool = False):
    """onnxruntime's session of the saved graph; with the weights streamed, a session running the graph piece by
    piece (`validate.piecewise`: never the whole graph's weights in memory)."""
    import onnxruntime as ort

    if streamed:
        session = PiecewiseSession(path)
        count = len(session.pieces)
        logger.info("    onnxruntime runs %s in %d piece%s of at most %d MB of weights (weights streamed)",
                    path.name, count, "s" if count > 1 else "", BUDGET // 2**20)
        return session
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def validate_graph(source, cases, arguments, output_names, options: ExportOptions, graph: str = "",
                   session=None, streamed: bool = False, draws: tuple[str, ...] = ()) -> list:
    """onnxruntime vs PyTorch on the captured calls (`validate.references`): the table logged, --atol enforced.
    `source`: the graph's path or an open session; `session(ort_session)`: a wrapper feeding the session (e.g.
    only the inputs its graph kept)."""
    loaded = source if hasattr(source, "run") else open_session(source, streamed)
    rows = compare(session(loaded) if session else loaded, cases, arguments, output_names)
    logger.info("    %sonnxruntime vs PyTorch on %d calls:\n%s", f"{graph}: " if graph else "", len(cases), table(rows))
    gate(rows, options.atol, options.dtype, graph, draws)
    return rows


def quantize_weights(model: ir.Model, options: ExportOptions) -> dict:
    """--quantize: the graph's MatMul weights in 4 or 8 bits (`onnx_passes.quantize`); what was done, for the manifest."""
    scheme = Scheme.named(options.quantize, head=options.quantize_head, embeddings=options.quantize_embeddings)
    done = QuantizeWeights(scheme)
    done(model)
    return {**scheme.record(), "quantized": len(done.quantized), "kept": done.kept}


def validate_quantized(path: Path, reference, cases, arguments, bits: int, graph: str = "",
                       streamed: bool = False) -> list[dict]:
    """The quantized graph's logits against its fp32 graph's (`reference`, gated: `validate.quantized`) and
    PyTorch's (gated where there is no fp32 graph)."""
    got = quantized.logits_of(open_session(path, streamed), cases, arguments.input_names)
    torch_logits = [expected[quantized.LOGITS].float().numpy() for _, expected in cases]
    rows = [quantized.agreement("PyTorch", got, torch_logits, cases)]
    if reference is not None:  # None: weights streamed, the fp32 graph never written
        rows.insert(0, quantized.agreement("fp32 graph", got, reference, cases))
    logger.info("    %s%d-bit graph on %d calls:\n%s", f"{graph}: " if graph else "", bits, len(cases),
                quantized.table(rows))
    quantized.gate(rows, bits, graph)
    return quantized.as_dicts(rows)


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
    if ctx.tokenizer is None and ctx.processor is None:
        return
    kwargs = ctx.options.hub_options
    local = Path(ctx.model_id) / (kwargs.get("subfolder") or "")
    for name in preprocessor_files(ctx.model_id, kwargs):
        if local.is_dir():
            shutil.copyfile(local / name, ctx.staging / name)
        else:
            from huggingface_hub import hf_hub_download

            shutil.copyfile(hf_hub_download(ctx.model_id, name, **kwargs), ctx.staging / name)  # options.HUB_OPTIONS


__all__ = ["ONNX_DATA", "ONNX_FILE", "GraphInputs", "OnnxExporter", "copy_files", "onnx_files", "optimize_graph",
           "rename_io", "save_graph", "static_axes", "translate_program", "validate_graph"]
