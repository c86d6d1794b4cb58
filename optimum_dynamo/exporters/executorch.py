"""ExecuTorch backend: a decoder LM -> `model.pte` with its KV cache inside, in optimum-executorch's layout.

Stages after loading: capture a greedy generation through the static-cache wrapper (`static_cache`) ->
infer inputs and the dynamic `seq` axis from it (bounded by `max_seq_len`) -> torch.export (strict: a static
cache exports only so) -> lower to XNNPACK -> copy configs -> validate in `executorch.runtime` on the
captured calls, in order -> manifest. Each backend step is a small function; the stages call them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..capture import InputObserver
from ..errors import ExportError, PipelineError, describe
from ..manifest import component_record, write_manifest
from ..options import ExportOptions
from ..runtime.executorch import PTE_FILE
from ..runtime.greedy import greedy
from ..target import resolve
from ..validate import compare, gate, references, table
from .base import ExportContext, Exporter, stage
from .component import Component
from .onnx import copy_files
from .static_cache import StaticCacheLM

logger = logging.getLogger(__name__)

INPUTS = ["input_ids", "cache_position"]
OUTPUTS = ["logits"]
RECIPES = ("xnnpack",)
DEFAULT_MAX_SEQ_LEN = 128
CAPTURE_PROMPT = "the quick brown fox jumps over the lazy dog"
CAPTURE_STEPS = 4  # decode steps after the prefill
# Options this backend honours; any other set to a non-default value is refused, never ignored.
OPTIONS = frozenset({"task", "atol", "max_seq_len", "recipe", "trust_remote_code", "hub_options", "validate",
                     "pad_token_id", "dtype"})


@dataclass
class ExecutorchContext(ExportContext):
    wrapper: StaticCacheLM | None = None
    pte: Any = None  # executorch.exir.ExecutorchProgramManager


def check_executorch_options(options: ExportOptions) -> None:
    defaults = ExportOptions()
    unknown = [f.name for f in fields(options) if f.name not in OPTIONS and getattr(options, f.name) != getattr(defaults, f.name)]
    if unknown:
        raise ExportError(f"ExecuTorch export: unsupported option(s) {', '.join(unknown)}")
    if options.dtype != "fp32":
        raise ExportError(f"ExecuTorch export: dtype {options.dtype!r} is not supported yet (fp32 only)")
    max_seq_len, recipe = options.max_seq_len, options.recipe
    if isinstance(max_seq_len, bool) or not isinstance(max_seq_len, int) or max_seq_len < 4:
        raise ExportError(f"invalid --max_seq_len {max_seq_len!r}: expected an integer >= 4")
    if recipe not in RECIPES:
        raise ExportError(f"invalid --recipe {recipe!r}: the dynamo path supports {', '.join(RECIPES)}")


def capture_prompt(tokenizer, vocab_size: int, max_seq_len: int) -> list[int]:
    """A prompt of at least 2 tokens that leaves room for the capture's decode steps."""
    ids: list[int] = []
    if tokenizer is not None:
        ids = [int(t) for t in tokenizer(CAPTURE_PROMPT)["input_ids"] if int(t) < vocab_size]
    if len(ids) < 2:
        ids = [(7 * i + 3) % vocab_size for i in range(9)]
    return ids[: max(2, max_seq_len - CAPTURE_STEPS - 1)]


def metadata(config, generation_config, max_seq_len: int) -> dict[str, Any]:
    """The constant methods ExecuTorch's LLM runner and optimum-executorch read."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    eos = getattr(generation_config, "eos_token_id", None)
    eos = getattr(text, "eos_token_id", None) if eos is None else eos
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    bos = getattr(generation_config, "bos_token_id", None)
    bos = getattr(text, "bos_token_id", None) if bos is None else bos
    found = {
        "get_max_seq_len": max_seq_len,
        "get_max_batch_size": 1,
        "get_vocab_size": text.vocab_size,
        "use_kv_cache": True,
        "use_sdpa_with_kv_cache": False,
        "enable_dynamic_shape": True,
        "get_dtype": 6,  # ScalarType Float: the program runs in float32
        "get_eos_ids": eos,
        "get_bos_id": bos,
    }
    return {k: v for k, v in found.items() if v is not None}


def bounded_shapes(args, max_seq_len: int) -> dict[str, Any]:
    """The inferred dynamic axes, each named axis one `Dim` in [1, max_seq_len] (ExecuTorch plans memory for
    the upper bound; a larger input fails at run time)."""
    dims: dict[str, torch.export.Dim] = {}
    shapes = {}
    for name in INPUTS:
        axes = args.axis_names.get(name, {})
        shapes[name] = {
            axis: dims.setdefault(label, torch.export.Dim(label.replace(" ", "_"), min=1, max=max_seq_len))
            for axis, label in axes.items()
        } or None
    return shapes


def lower(program: torch.export.ExportedProgram, constants: dict[str, Any]):
    """XNNPACK delegation, then the ExecuTorch program (memory planned for each dynamic axis' upper bound).
    The cache buffers are stored zeroed: ExecuTorch leaves mutated buffers uninitialized by default, and the
    positions the mask hides are still multiplied by 0 in attention (a stale NaN would survive that)."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge_transform_and_lower
    from executorch.exir.passes import MemoryPlanningPass
    from executorch.exir.passes.init_mutable_pass import InitializedMutableBufferPass
    from executorch.exir.passes.sym_shape_eval_pass import ConstraintBasedSymShapeEvalPass

    edge = to_edge_transform_and_lower(
        {"forward": program},
        partitioner=[XnnpackPartitioner()],
        compile_config=EdgeCompileConfig(_check_ir_validity=False, _skip_dim_order=True),
        constant_methods=constants,
    )
    return edge.to_executorch(ExecutorchBackendConfig(
        extract_delegate_segments=True,
        passes=[InitializedMutableBufferPass(["cache"])],
        memory_planning_pass=MemoryPlanningPass(alloc_graph_input=False),
        sym_shape_eval_pass=ConstraintBasedSymShapeEvalPass(),
    ))


class PteSession:
    """A loaded `.pte` method behind the small session interface `validate.compare` uses."""

    def __init__(self, path: Path, method: str = "forward"):
        from executorch.runtime import Runtime

        self.program = Runtime.get().load_program(str(path))
        self.method = self.program.load_method(method)

    def run(self, _names, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        outputs = self.method.execute([torch.from_numpy(np.ascontiguousarray(feed[n])) for n in INPUTS])
        return [o.numpy() for o in outputs]

    def get_outputs(self) -> list:
        return []  # no named axes: logits' token axis is found from input_ids' shape


class ExecutorchExporter(Exporter):
    backend = "executorch"

    def components(self, ctx: ExecutorchContext) -> list[Component]:
        """The static-cache wrapper, observed during a greedy generation."""
        max_seq_len = ctx.options.max_seq_len
        if ctx.task.base != "text-generation":
            raise ExportError(f"ExecuTorch export supports text-generation (decoder LMs), not {ctx.task.name}")
        config = ctx.model.config
        try:
            ctx.wrapper = StaticCacheLM(ctx.model, max_seq_len).eval()
        except Exception as e:
            raise PipelineError(f"{config.model_type}: no static cache for this model ({describe(e)})") from e
        prompt = capture_prompt(ctx.tokenizer, ctx.wrapper.vocab_size, max_seq_len)
        with torch.no_grad(), InputObserver(ctx.wrapper, "forward") as obs:
            try:
                greedy(ctx.wrapper, prompt, max_seq_len=max_seq_len, max_new_tokens=CAPTURE_STEPS + 1)
            except Exception as e:
                raise PipelineError(f"{config.model_type}: does not run with a static KV cache ({describe(e)})") from e
        for call in obs.calls:
            call.outputs = {"logits": call.outputs}
        ctx.observer = obs
        ctx.wrapper.reset()  # the program starts from an empty cache
        logger.info("    %s", obs.summary())
        # strict: a static cache exports only so; batch 1 (the .pte's contract)
        return [Component("model", obs, INPUTS, dynamic_batch=False, dynamic_sequence=True, size_oblivious=False,
                          strict=True, output_names=list(OUTPUTS))]

    def infer(self, ctx: ExecutorchContext) -> None:
        super().infer(ctx)
        ctx.arguments.dynamic_shapes = bounded_shapes(ctx.arguments, ctx.options.max_seq_len)

    @stage("lower to ExecuTorch (XNNPACK)")
    def lower(self, ctx: ExecutorchContext) -> None:
        ctx.wrapper.reset()
        constants = metadata(ctx.model.config, getattr(ctx.model, "generation_config", None), ctx.options.max_seq_len)
        try:
            ctx.pte = lower(ctx.only.program, constants)
        except Exception as e:
            raise PipelineError(f"cannot lower {ctx.config.model_type} to ExecuTorch: {describe(e)}") from e
        ctx.only.program = None
        ctx.manifest["metadata"] = constants

    @stage("save")
    def save(self, ctx: ExecutorchContext) -> None:
        with open(ctx.staging / PTE_FILE, "wb") as f:
            ctx.pte.write_to_file(f)
        ctx.pte = None

    @stage("copy configs and tokenizer")
    def copy_files(self, ctx: ExecutorchContext) -> None:
        copy_files(ctx)

    @stage("validate with executorch.runtime", when=lambda options: options.validate)
    def validate(self, ctx: ExecutorchContext) -> None:
        session = PteSession(ctx.staging / PTE_FILE)  # a fresh program: its cache evolves as during capture
        ctx.only.discrepancies = compare(session, references(ctx.observer.calls, ctx.arguments, ctx.wrapper),
                                           ctx.arguments, ctx.output_names)
        logger.info("    executorch vs PyTorch on %d calls:\n%s", len(ctx.observer.calls), table(ctx.discrepancies))
        if len(ctx.discrepancies) != len(OUTPUTS):
            raise PipelineError("validation compared no output of the .pte")
        gate(ctx.discrepancies, ctx.options.atol)

    @stage("write manifest")
    def manifest(self, ctx: ExecutorchContext) -> None:
        write_manifest(
            ctx,
            {"model": component_record(ctx.only, [PTE_FILE])},
            backend=self.backend,
            runtime="optimum.executorch.ExecuTorchModelForCausalLM",
            recipe=ctx.options.recipe,
            max_seq_len=ctx.options.max_seq_len,
            cache_lengths=[layer.max_cache_len for layer in ctx.wrapper.cache.layers],  # sliding layers: the window
            metadata=ctx.manifest.get("metadata", {}),
        )


def export_executorch(model, output, task: str | None = None, *, max_seq_len: int = DEFAULT_MAX_SEQ_LEN,
                      recipe: str = "xnnpack", atol: float | None = None, **options) -> ExecutorchContext:
    """Export a decoder LM (hub id, local dir, or an in-memory `PreTrainedModel`) to `output/model.pte` for
    ExecuTorch: `forward(input_ids[1, seq], cache_position[seq]) -> logits` with a static KV cache of
    `max_seq_len` positions inside; the task defaults to text-generation. `atol`: the largest difference from PyTorch accepted on the captured calls.
    Other options as `export_onnx`: `trust_remote_code`, `hub_options`, `validate`, `pad_token_id`, `dtype` (fp32)."""
    options = ExportOptions.make(task=task, max_seq_len=max_seq_len, recipe=recipe, atol=atol, **options)
    check_executorch_options(options)
    target = resolve(model, options, default_task="text-generation")  # the one task this backend exports
    return ExecutorchExporter().run(ExecutorchContext(output=Path(output), options=options, target=target))
