"""Staged exporters. A stage is a method decorated with `@stage("label")`; stages run in the order
they are defined, base class first (`when=` a predicate of the export options: the stage runs, and is listed,
only in the exports it has work in). The stages shared by every backend live here:

    load -> capture -> infer arguments -> torch.export

Backends (ONNX, ExecuTorch) add their own stages after these. An export is a list of components (one
graph each, see `component.py`): every stage after capture runs once per component, and exporters differ
only in how `components(ctx)` builds the list. Files are written to a staging directory
(`staging.staged`) and moved in place only when every stage has passed.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import re
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from legacy_bridge import cache_argument

from .. import flatten, patches, quiet, streaming, supported
from ..flatten import flat_outputs
from ..flatten.naming import OUTPUT_PREFIX
from ..capture import CaptureError, InputObserver, infer_arguments
from ..capture.samples import main_input, zeros_are_default
from ..capture.stepping import is_state_model
from ..errors import ExportError, PipelineError, describe, out_of_memory
from ..validate import random_draws
from ..flags import DTYPES
from ..options import ExportOptions
from ..positions import default_positions
from ..patches.transformers_sliding import seen_tokens_hook
from ..staging import staged
from ..target import Target
from ..tasks import Task
from . import size_guards
from .component import Component

logger = logging.getLogger(__name__)
# Patches and pytree registrations are process-wide: exports in one process run one at a time.
_ONE_AT_A_TIME = threading.RLock()  # re-entrant: an exporter may run another inside its stages
OFFLOAD = ".offload"  # in staging: what a streamed load cannot read in place (removed by the manifest stage)


def stage(label: str, when=None):
    def decorator(fn):
        fn._stage_label, fn._stage_when = label, when
        return fn

    return decorator


@dataclass
class ExportContext:
    output: Path
    options: ExportOptions = field(default_factory=ExportOptions)
    target: Target | None = None  # None: a module the caller observed (export_observed, VLM parts)
    model_id: str = ""
    task: Task | None = None
    config: Any = None
    model: Any = None
    tokenizer: Any = None
    processor: Any = None  # image processor or feature extractor
    observer: InputObserver | None = None  # the capture's observer of the whole model
    generations: list = field(default_factory=list)  # the capture's greedy generations (`validate.generate`)
    components: list[Component] = field(default_factory=list)
    calls_cache: tuple[bool, bool] | None = None  # `generation_cache`'s (enabled, plain_calls) of the capture
    staging: Path | None = None
    manifest: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    streamed: bool = False  # the weights stay in the checkpoint (`streaming`)

    @property
    def discrepancies(self) -> list[Any]:
        """Every component's validation rows."""
        return [row for part in self.components for row in part.discrepancies]

    # the one component of a single-graph export (a decoder, an observed module, a .pte)
    @property
    def only(self) -> Component:
        if len(self.components) != 1:
            raise AttributeError(f"this export has {len(self.components)} components: read ctx.components")
        return self.components[0]

    @property
    def arguments(self):
        return self.only.arguments

    @property
    def output_names(self) -> list[str]:
        return self.only.output_names


@contextlib.contextmanager
def generation_cache(model, enabled: bool, plain_calls: bool = False):
    """`enabled=False`: `generate` runs without a cache, as the runtime runs a graph without past inputs (the
    whole sequence in every call); with `plain_calls`, the model's own calls too (a decoder's hidden states for
    feature-extraction would otherwise come with the cache a forward returns by default)."""
    # transformers 5's GenerationConfig leaves use_cache None (the model's config decides): set it all the same;
    # plain calls: every module's config too (T5's stacks hold copies of the model's, which MT5's classifier reads)
    configs = [getattr(model, "generation_config", None)]
    if plain_calls:
        configs += [getattr(module, "config", None) for module in model.modules()]
    configs = list({id(c): c for c in configs if c is not None and hasattr(c, "use_cache")}.values())
    saved = [c.use_cache for c in configs]
    try:
        if not enabled:
            for config in configs:
                config.use_cache = False
        yield
    finally:
        for config, value in zip(configs, saved):
            config.use_cache = value


class Exporter:
    backend = "base"
    capture_error: type[Exception] = PipelineError  # what a capture the inference cannot use raises

    @classmethod
    def stages(cls, options: ExportOptions | None = None) -> list[tuple[str, str]]:
        """(label, method name) in run order; with `options`, only the stages that have work in that export."""
        found: list[tuple[str, str]] = []
        for klass in reversed(cls.__mro__):
            for name, fn in vars(klass).items():  # label and `when` from the first definition
                if hasattr(fn, "_stage_label") and all(n != name for _, n in found):
                    if options is None or fn._stage_when is None or fn._stage_when(options):
                        found.append((fn._stage_label, name))
        return found

    def run(self, ctx: ExportContext) -> ExportContext:
        supported.check()  # every exporter (the VLM one loads its own way), before anything is staged
        with _ONE_AT_A_TIME, quiet.third_party():
            with staged(ctx.output) as ctx.staging, flatten.registered():  # export and validation walk cache pytrees
                self._run_stages(ctx, self.stages(ctx.options))
        return ctx

    def _run_stages(self, ctx: ExportContext, stages) -> None:
        for i, (label, name) in enumerate(stages, 1):
            start = time.perf_counter()
            logger.info("[%d/%d] %s", i, len(stages), label)
            try:
                getattr(self, name)(ctx)
            except Exception as e:
                if isinstance(e, ExportError) or not out_of_memory(e):
                    raise
                raise ExportError(f"out of memory in stage [{i}/{len(stages)}] {label} ({describe(e)}): the export "
                                  "needs more memory than this process may use (docs: Big models)") from e
            ctx.timings[label] = round(time.perf_counter() - start, 3)

    def graph_label(self, ctx: ExportContext, part: Component) -> str:
        """How messages name a component: not at all when it is the only one."""
        return part.name if len(ctx.components) > 1 else ""

    # ── Stage: load ──
    @stage("load model")
    def load(self, ctx: ExportContext) -> None:
        target = ctx.target
        ctx.model_id, ctx.config, ctx.task = target.model_id, target.config, target.task
        if target.model is not None:  # an in-memory model (onnx_export_from_model): captured as it is
            ctx.model = target.model.eval()
            return
        dtype = getattr(torch, DTYPES[ctx.options.dtype])
        needed = streaming.export_bytes(ctx.model_id, dtype, ctx.options.hub_options) if self.backend == "onnx" else 0
        if self.backend == "onnx" and streaming.wanted(needed):
            if not ctx.task.spec.streams:
                self.in_memory_instead(needed, f"streaming does not cover {ctx.target.library} models yet", (
                    f"streaming the weights does not cover {ctx.target.library} models yet (docs: Big models); set "
                    f"{streaming.ENV}=0 to export with the weights in memory"))
            elif ctx.options.pt2 or ctx.options.aoti:  # a program of the weights in memory
                self.in_memory_instead(needed, "--pt2/--aoti write the weights from memory", (
                    "--pt2/--aoti write the weights from memory: this model's are streamed from the checkpoint "
                    f"(docs: Big models); drop --pt2/--aoti or set {streaming.ENV}=0"))
            else:
                ctx.model = load_weights(ctx, streaming.loading(dtype, ctx.staging / OFFLOAD))
                ctx.streamed = not (is_state_model(ctx.model) and self.in_memory_instead(
                    needed, "streaming does not cover state-space models yet", (
                        f"{ctx.config.model_type}: streaming the weights does not cover state-space models yet "
                        f"(docs: Big models); set {streaming.ENV}=0 to export with the weights in memory")))
        if ctx.streamed:
            streaming.alias_tied(ctx.model)
            logger.info("    weights streamed from the checkpoint: %d tensors on the meta device, each read when its "
                        "module runs and when it is saved", len(streaming.sources(ctx.model)))
            if dtype != torch.float32:
                streaming.cast_buffers(ctx.model, dtype)
        else:
            ctx.model = load_weights(ctx)
            if ctx.options.dtype != "fp32":  # --dtype: captured, exported and validated in that dtype
                ctx.model.to(dtype)
        ctx.tokenizer = preprocessor(ctx.model_id, ctx.options.loading, *_preprocessors(ctx.model))

    @staticmethod
    def in_memory_instead(needed: int, why: str, refusal: str) -> bool:
        """What streaming does not cover (state-space models: their caches are made on the model's device, meta
        when streamed; --pt2/--aoti) loads the `needed` bytes of weights in memory when only the size chose
        streaming and they fit; `refusal` when streaming is forced or they do not fit."""
        if streaming.forced() or not streaming.fits_in_memory(needed):
            raise ExportError(refusal)
        logger.info("    weights loaded in memory: %s", why)
        return True

    # ── Stage: capture ──
    @stage("capture generation")
    def capture(self, ctx: ExportContext) -> None:
        try:
            ctx.components = self.components(ctx)
        except RuntimeError as e:  # streamed: a forward read the embedding's rows itself, not through its forward
            if not (ctx.streamed and streaming.read_outside_its_module(e)):
                raise
            kept = streaming.keep_input_embedding(ctx.model)
            if not kept:
                raise
            logger.info("    %s reads its input embedding outside the embedding's forward: kept in memory (%.1f MB), "
                        "captured again", type(ctx.model).__name__, kept / 2**20)
            ctx.components = self.components(ctx)

    def components(self, ctx: ExportContext) -> list[Component]:
        """One graph of the whole model, observed while the task's driver runs it."""
        cached = ctx.task.with_past
        if ctx.task.with_past and ctx.task.base == "text-generation":
            check_takes_cache(ctx.model, ctx.config.model_type, ctx.task.name)
            if is_state_model(ctx.model) and (warning := supported.state_cache_warning(ctx.config.model_type)):
                logger.warning(warning)
        fed = None if ctx.task.base == "text-generation" else ctx.task.model_inputs(ctx.model)  # generate: its own
        plain = ctx.task.base != "text-generation"  # a task of plain calls: no cache from them either
        ctx.calls_cache = (cached, plain)  # traced the same way: a forward reading use_cache from its config
        with forward_adapter(ctx.model, ctx.options.model_kwargs, inputs=fed) as dropped, \
                generation_cache(ctx.model, cached, plain_calls=plain), InputObserver(ctx.model, "model") as obs:
            try:
                ctx.generations = ctx.task.spec.driver(ctx.model, ctx.tokenizer) or []
            except ValueError as e:  # a decoder's sequence classification finds each row's last token by its pad id
                if "no padding token" not in str(e):
                    raise
                raise ExportError(f"{type(ctx.model).__name__} runs one row at a time without a pad token, and its "
                                  "config has no pad_token_id: pass --pad_token_id N (the tokenizer's pad or eos id)"
                                  ) from e
        ctx.observer = obs
        logger.info("    %s", obs.summary())
        for name in sorted(dropped):  # what the task's pipeline gives, the runtime class cannot feed
            logger.warning("    %s: %s takes it and the preprocessor gives it, but %s feeds none: the graph takes none "
                           "(rows the preprocessor padded differ from PyTorch's with it)", name,
                           type(ctx.model).__name__, ctx.task.spec.runtime_class)
        _warn_unlike_the_runtime_fill(ctx, obs.calls)
        _check_read_outputs(ctx, obs.calls)
        if ctx.task.with_past and ctx.task.base == "text-generation":
            check_cache_returned(obs.calls, ctx.config.model_type, ctx.task.name)
        forward = inspect.signature(ctx.model.forward).parameters
        constants = ctx.task.spec.constants if ctx.task.with_past else {"use_cache": False}
        constants = {k: v for k, v in constants.items() if k in forward}
        constants.update(model_kwargs(ctx.model, ctx.options.model_kwargs))
        # Text axes (batch, sequence) are dynamic by meaning, even if every call had one size; state models
        # (Mamba, hybrids) are stepped one token per call by design, so their sequence axis is 1.
        stepped = ctx.task.with_past and is_state_model(ctx.model)
        part = Component("model", obs, ctx.task.model_inputs(ctx.model), constants, dynamic_sequence=not stepped,
                         image_size_chosen=plain)
        if ctx.task.base == "text-generation" and "position_ids" in part.inputs:  # what a plain call means
            part.metadata = default_positions(ctx.model, obs.calls)
        return [part]

    # ── Stage: infer ──
    @stage("infer inputs and dynamic shapes")
    def infer(self, ctx: ExportContext) -> None:
        for part in ctx.components:
            self.infer_part(ctx, part)

    def infer_part(self, ctx: ExportContext, part: Component) -> None:
        try:
            args = infer_arguments(part.calls, part.inputs, part.constants, dynamic_batch=part.dynamic_batch,
                                   dynamic_sequence=part.dynamic_sequence)
        except CaptureError as e:
            label = self.graph_label(ctx, part)
            raise self.capture_error(f"{label}: {e}" if label else str(e)) from e
        args.axis_names = {n: {a: part.labels.get(name, name) for a, name in axes.items()}
                           for n, axes in args.axis_names.items()}
        part.arguments = args

    # ── Stage: torch.export ──
    @stage("torch.export")
    def export_program(self, ctx: ExportContext) -> None:
        with generation_cache(ctx.model, *ctx.calls_cache) if ctx.calls_cache else contextlib.nullcontext():
            self._export_parts(ctx)

    def _export_parts(self, ctx: ExportContext) -> None:
        for part in ctx.components:
            self.export_part(ctx, part)
            part.random_draws = random_draws(part.program)
            axes = size_guards.image_axes(part.arguments) if part.image_size_chosen else {}
            if axes and (found := size_guards.branches(part.program, axes, partial(_runs_at, part))):
                size = _keep_first_size(part, axes)
                logger.warning("    %s: the image size fixed at %s, the capture's first (the config's image_size, else 64): "
                               "%s branches on it (%s); a graph of any size would take the wrong branch at some",
                               ", ".join(axes), " x ".join(map(str, size)), type(part.module).__name__, "; ".join(found))
                self.infer_part(ctx, part)
                self.export_part(ctx, part)

    def export_part(self, ctx: ExportContext, part: Component) -> None:
        args = part.arguments
        _plain_buffers(part.module)
        with patches.applied(options=_patch_options(ctx.options)), torch.no_grad(), seen_tokens_hook(part.module), \
                streaming.hooks_off(ctx.model):
            with torch.fx.experimental._config.patch(backed_size_oblivious=part.size_oblivious), \
                    quiet.printed_graphs(), _named_forward(part.module, list(args.kwargs)):
                try:
                    part.program = _trace(part, part.strict)
                except torch._dynamo.exc.UserError as e:
                    fixed = _fixed_axes(e, args.axis_names)
                    if fixed is None or part.strict:
                        raise fixed or e
                    part.program = _strict_export(part, fixed)


@contextlib.contextmanager
def _named_forward(module, names: list[str]):
    """`module.forward` taking each of `names` by name while it is traced, where it takes some only through
    `**kwargs` (OmniASR's attention mask): torch 2.15's guards on such an input read it from a `kwargs` their
    function does not have (NameError: name 'L' is not defined)."""
    params = inspect.signature(module.forward).parameters
    if all(n in params for n in names) or not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        yield
        return
    saved, original = vars(module).get("forward"), module.forward

    def forward(**kwargs):
        return original(**kwargs)

    forward.__signature__ = inspect.Signature(
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None) for n in names])
    module.forward = forward
    try:
        yield
    finally:
        if saved is None:
            del module.forward
        else:
            module.forward = saved


def _trace(part: Component, strict: bool) -> torch.export.ExportedProgram:
    args = part.arguments
    return torch.export.export(part.module, (), kwargs=args.kwargs, dynamic_shapes=args.dynamic_shapes, strict=strict)


def _strict_export(part: Component, fixed: PipelineError) -> torch.export.ExportedProgram:
    """Non-strict tracing made an axis a Python number (`len(tensor)`: RT-DETR's batch); torch.export's strict mode
    (Dynamo) traces such reads as sizes. Its failure is reported as the fixed axes."""
    logger.info("    %s: traced again in torch.export's strict mode (%s)", type(part.module).__name__, fixed)
    try:
        program = _trace(part, strict=True)
    except Exception:
        raise fixed from None
    part.strict = True
    return program


@torch.no_grad()
def _runs_at(part: Component, name: str, axis: int, size: int) -> bool:
    """The model runs on the sample with input `name` of `size` on `axis` (random values)."""
    sample = part.arguments.kwargs[name]
    shape = list(sample.shape)
    shape[axis] = size
    try:
        part.module(**{**part.arguments.kwargs, name: torch.randn(shape, dtype=sample.dtype)})
    except Exception:
        return False
    return True


def _keep_first_size(part: Component, axes: dict[str, tuple[int, ...]]) -> tuple[int, ...]:
    """Drops the calls whose images are not of the first call's size (the image driver starts at the config's
    image_size); that size."""
    def size(call):
        return tuple(call.kwargs[n].shape[a] if n in call.kwargs else None for n, ax in axes.items() for a in ax)

    first = size(part.calls[0])
    part.calls[:] = [c for c in part.calls if size(c) == first]
    return first


def _warn_unlike_the_runtime_fill(ctx: ExportContext, calls) -> None:
    """The tokenizer gives token_type_ids, but the model computes others when given none (BigBird's question
    answering): the graph takes them, and a user who leaves them out gets the runtime class's zeros instead.
    Without a tokenizer the samples asked already (`text_batches`: zeros only where they are the default)."""
    if ctx.tokenizer is None or ctx.task.base == "text-generation":
        return
    first = next((c.kwargs for c in calls if "token_type_ids" in c.kwargs and "input_ids" in c.kwargs), None)
    if first is None or zeros_are_default(ctx.model, first, "token_type_ids"):
        return
    logger.warning("    token_type_ids: %s computes its own when given none, not zeros; %s feeds zeros when given "
                   "none: pass the tokenizer's token_type_ids", type(ctx.model).__name__, ctx.task.spec.runtime_class)


def _check_read_outputs(ctx: ExportContext, calls) -> None:
    """The runtime class reads its outputs by name (`logits`): a model that returns them under another (PP-LCNet's
    classifier: `last_hidden_state`) would give a graph the class cannot run, whatever its numbers."""
    returned = list(flat_outputs(calls[0].outputs)) if calls else []
    missing = [name for name in ctx.task.spec.reads if name not in returned]
    if returned and missing:
        raise PipelineError(f"{type(ctx.model).__name__} returns no {' or '.join(missing)} (it returns "
                            f"{', '.join(returned)}), which {ctx.task.spec.runtime_class} reads")


_SPECIALIZED = re.compile(r"You marked L\['(\w+)'\]\.size\(\)\[(\d+)\] as dynamic but your code specialized it to be a "
                          r"constant \((\d+)\)")


def _fixed_axes(error: Exception, axis_names: dict) -> PipelineError | None:
    """torch.export's "Constraints violated" when the model's code fixes an axis the capture saw vary: one line naming
    the axes and their sizes (a graph for one length would be wrong for every other)."""
    found = _SPECIALIZED.findall(str(error))
    if not found:
        return None
    axes = ", ".join(f"{name}'s {axis_names.get(name, {}).get(int(axis), f'axis {axis}')} to {size}"
                     for name, axis, size in found)
    return PipelineError(f"the model's code fixes {axes} (a Python number made from a tensor's size): a graph that "
                         "takes other sizes cannot be traced from it")


def _no_cache(model_type: str, task: str) -> PipelineError:
    return PipelineError(f"{model_type} returns no key/value cache from generate, so there is none for --task {task} "
                         "to carry; export with --task text-generation")


def check_takes_cache(model, model_type: str, task: str) -> None:
    """A -with-past decoder whose forward takes no cache at all (openai-gpt, xlm; rwkv keeps its `state`): refused before
    `generate` would refuse it in its own words."""
    params = inspect.signature(model.forward).parameters
    if cache_argument.parameter(params) is None and not {"past", "mems"} & set(params):
        raise _no_cache(model_type, task)
    if getattr(model, "_supports_cache_class", True) is False and not is_state_model(model):  # XGLM on 4.53
        import transformers

        raise PipelineError(f"{model_type} on transformers {transformers.__version__} carries its key/value cache as "
                            f"legacy tuples only (its generate refuses a Cache object), which --dynamo does not export "
                            f"for --task {task}: a newer transformers gives it a cache class (tested: 4.55.4 and later)")


def check_cache_returned(calls, model_type: str, task: str) -> None:
    """A -with-past decoder must return a cache this package can flatten (to `present.*`, or a legacy tuple of
    layers) from some captured call; else PipelineError naming why: no cache at all, or a cache class that no
    flattening is registered for."""
    unregistered = None
    for call in calls:
        if any(name.startswith(f"{OUTPUT_PREFIX}.") for name in flat_outputs(call.outputs)):
            return
        value = cache_argument.of(call.outputs)
        if isinstance(value, tuple) and value:
            return
        if value is not None and not isinstance(value, tuple) and not flatten.is_cache(value):
            unregistered = f"{type(value).__module__}.{type(value).__qualname__}"
    if unregistered:
        raise PipelineError(f"{model_type}: no cache flattening is registered for {unregistered} "
                            "(optimum_dynamo.flatten)")
    raise _no_cache(model_type, task)


def load_weights(ctx: ExportContext, loading: dict | None = None):
    """The task's model of the checkpoint (`loading`: more `from_pretrained` keywords). Missing, truncated or
    mis-shaped weights are the checkpoint's problem: one line; running out of memory is not (the stage runner
    names the stage)."""
    try:
        return _load_model(_tasks_auto_class(ctx.task), ctx.model_id, ctx.config,
                           {**ctx.options.loading, **(loading or {})})
    except Exception as e:
        if out_of_memory(e):
            raise
        raise ExportError(f"cannot load weights of {ctx.model_id}: {describe(e, lines=2)}") from e


def release_weights(ctx: ExportContext) -> None:
    """Free the weights of a model the export loaded itself once PyTorch is not run again (the validation
    session loads its own copy: at most one extra copy alive). A model the caller passed is left alone.
    The tensors are emptied in place, not replaced: other holders of the same tensor objects (the ONNX
    translation's initializers) must not keep the memory, nor the checkpoint's mapped file, alive."""
    if ctx.target is None or ctx.target.model is not None or not isinstance(ctx.model, torch.nn.Module) or ctx.streamed:
        return
    for tensor in (*ctx.model.parameters(), *ctx.model.buffers()):
        tensor.data = torch.empty(0, dtype=tensor.dtype)


def _patch_options(options: ExportOptions) -> tuple[str, ...]:
    """Optional patches an export asks for: fused levels keep grouped key/value heads unrepeated."""
    from ..patches.transformers_gqa import FUSED_ATTENTION

    return (FUSED_ATTENTION,) if options.optimize_level in ("O3", "O4") else ()


def _plain_buffers(model) -> None:
    """Buffers registered as `nn.Parameter` (falcon_mamba on transformers 4) are seen twice by
    torch.export's unlifting ("attribute already exists"): keep their values as plain tensors."""
    for module in model.modules():
        for name, buffer in module._buffers.items():
            if isinstance(buffer, torch.nn.Parameter):
                module._buffers[name] = buffer.data


def _load_model(auto_class, model_id: str, config, kwargs: dict):
    """transformers >= 5 runs MoE experts as grouped matmuls by default, a custom op ONNX cannot translate:
    ask for batched matmuls (models without experts refuse the option and load as they are).
    A config class the auto class does not map (transformers saves emu3's and mllama's causal LM with their
    text config, which AutoModelForCausalLM then refuses) loads with the class the checkpoint names in
    `architectures` if that class is of the task (`...ForCausalLM` for AutoModelForCausalLM); any other
    model keeps the refusal (a T5 checkpoint asked for text-generation)."""
    import transformers

    try:
        return _load_with(auto_class, model_id, config, kwargs)
    except ValueError as e:
        suffix = auto_class.__name__.removeprefix("AutoModel")
        named = [getattr(transformers, n) for n in getattr(config, "architectures", None) or ()
                 if suffix and n.endswith(suffix) and hasattr(transformers, n)]
        if "Unrecognized configuration class" not in str(e) or not named:
            raise
        return _load_with(named[0], model_id, config, kwargs)


def _load_with(model_class, model_id: str, config, kwargs: dict):
    from transformers import PreTrainedModel

    if kwargs.get("device_map") == streaming.DISK:
        kwargs = dict(kwargs, device_map=streaming.device_map(model_class, config))

    if hasattr(PreTrainedModel, "_check_and_adjust_experts_implementation"):
        try:
            return model_class.from_pretrained(model_id, config=config, experts_implementation="batched_mm", **kwargs).eval()
        except (ValueError, TypeError):
            pass
    return model_class.from_pretrained(model_id, config=config, **kwargs).eval()


# Files that hold a preprocessor, per auto class: one must be in the checkpoint for the class to be used
# (transformers 5 builds an empty tokenizer from a directory without any: every text becomes [bos, eos]).
PREPROCESSOR_FILES = {
    "AutoTokenizer": ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model", "tokenizer.model",
                      "sentencepiece.bpe.model", "source.spm", "merges.txt"),
    "AutoImageProcessor": ("preprocessor_config.json",),
    "AutoFeatureExtractor": ("preprocessor_config.json",),
}
OTHER_PREPROCESSOR_FILES = ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "target.spm",
                            "processor_config.json", "chat_template.jinja", "chat_template.json")


def source_files(model_id: str, kwargs: dict) -> set[str] | None:
    """File names of a checkpoint directory or hub repo (None when the hub cannot be asked)."""
    path = Path(model_id) / (kwargs.get("subfolder") or "")
    if path.is_dir():
        return {p.name for p in path.iterdir()}
    try:
        from huggingface_hub import list_repo_files

        files = list_repo_files(model_id, revision=kwargs.get("revision"), token=kwargs.get("token"))
    except Exception:
        return None
    prefix = f"{kwargs['subfolder']}/" if kwargs.get("subfolder") else ""
    return {f[len(prefix):] for f in files if f.startswith(prefix)}


def preprocessor_files(model_id: str, kwargs: dict) -> list[str]:
    """The checkpoint's own preprocessor files (copied as they are into the export)."""
    files = source_files(model_id, kwargs) or set()
    known = {name for names in PREPROCESSOR_FILES.values() for name in names} | set(OTHER_PREPROCESSOR_FILES)
    return sorted(files & known)


def preprocessor(model_id: str, kwargs: dict, autos: tuple[str, ...] = ("AutoTokenizer", "AutoImageProcessor")):
    """The checkpoint's first preprocessor among `autos` (transformers auto class names) whose files it
    really has, else None (samples are then synthesized)."""
    import transformers

    files = source_files(model_id, kwargs) or set()
    for name in autos:
        if not files & set(PREPROCESSOR_FILES[name]):
            continue
        try:
            return getattr(transformers, name).from_pretrained(model_id, **kwargs)
        except Exception:
            continue
    return None


def _preprocessors(model) -> tuple[tuple[str, ...], ...]:
    """The auto classes of the preprocessor the capture feeds the model through, by its main input (audio models:
    the feature extractor, although CTC checkpoints also have a tokenizer, for their output)."""
    if main_input(model) in ("input_values", "input_features"):
        return (("AutoFeatureExtractor",),)
    return ()


def model_kwargs(model, kwargs: dict | None) -> dict:
    """`--model-kwargs`: keyword arguments of the model's forward, returned to be passed in every call.
    A transformers 5 forward takes the output switches (`output_hidden_states`, ...) through `**kwargs`,
    which torch.export cannot fix as constants: those are set on the model's config instead (saved in
    config.json). Any other key is refused."""
    if not kwargs:
        return {}
    forward = inspect.signature(model.forward).parameters
    named = {n for n, p in forward.items() if p.kind is not inspect.Parameter.VAR_KEYWORD}
    switches = _config_flags(model) if len(named) < len(forward) else {}
    unknown = sorted(k for k in kwargs if k not in named and k not in switches)
    if unknown:
        raise ExportError(f"--model-kwargs: {', '.join(unknown)} not an argument of {type(model).__name__}.forward")
    for key in set(kwargs) - named:
        setattr(model.config, key, kwargs[key])
    return {k: v for k, v in kwargs.items() if k in named}


def _config_flags(model) -> dict:
    """Keyword arguments a transformers 5 forward takes through `**kwargs`: the config's output switches."""
    return {k: None for k in ("output_hidden_states", "output_attentions", "return_dict") if hasattr(model.config, k)}


@contextlib.contextmanager
def forward_adapter(module, kwargs: dict | None, *others, inputs: list[str] | None = None):
    """While capturing: every call of `module` (and `others`, e.g. an encoder generate calls directly) gets
    `kwargs` (`--model-kwargs`), and floating inputs in the module's dtype (`--dtype`: samples are float32).
    `inputs`: the only tensors `module` is given, those its runtime class feeds (OmniASR's `padding_mask`: none);
    yields the names of the tensors held back."""
    dtype = next((p.dtype for p in module.parameters() if p.is_floating_point()), torch.float32)
    fixed = model_kwargs(module, kwargs)
    dropped: set[str] = set()

    def adapt(mod, args, call_kwargs):
        cast = lambda t: t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t  # noqa: E731
        if mod is module:
            if inputs is not None:
                dropped.update(k for k, v in call_kwargs.items() if k not in inputs and isinstance(v, torch.Tensor))
                call_kwargs = {k: v for k, v in call_kwargs.items() if k in inputs or not isinstance(v, torch.Tensor)}
            call_kwargs = {**call_kwargs, **fixed}
        return tuple(cast(a) for a in args), {k: cast(v) for k, v in call_kwargs.items()}

    handles = [m.register_forward_pre_hook(adapt, with_kwargs=True, prepend=True) for m in (module, *others)]
    try:
        yield dropped
    finally:
        for handle in handles:
            handle.remove()


def _tasks_auto_class(task):
    import importlib

    import transformers
    from optimum.exporters.tasks import TasksManager

    from legacy_bridge import transformers5

    if task.spec.auto_class is not None and "." in task.spec.auto_class:  # a class of ours (module.Class)
        module, name = task.spec.auto_class.rsplit(".", 1)
        return getattr(importlib.import_module(module), name)
    if task.spec.auto_class is not None:
        return getattr(transformers, task.spec.auto_class)
    transformers5.reapply()  # names optimum looks up on transformers (e.g. AutoModelForVision2Seq on 5.x)
    return TasksManager.get_model_class_for_task(task.base, library="transformers")
