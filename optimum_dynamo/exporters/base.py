"""Staged exporters. A stage is a method decorated with `@stage("label")`; stages run in the order
they are defined, base class first. The stages shared by every backend live here:

    load -> capture -> infer arguments -> torch.export

Backends (ONNX, .pt2, ExecuTorch) add their own stages after these. Files are written to a
staging directory (`staging.staged`) and moved in place only when every stage has passed.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .. import flatten, patches, quiet
from ..capture import CaptureError, InputObserver, infer_arguments
from ..capture.stepping import is_state_model
from ..errors import ExportError, PipelineError
from ..flags import DTYPES
from ..options import check_options
from ..patches.transformers_sliding import seen_tokens_hook
from ..staging import staged
from ..tasks import Task, resolve_task

logger = logging.getLogger(__name__)
# Patches and pytree registrations are process-wide: exports in one process run one at a time.
_ONE_AT_A_TIME = threading.RLock()  # re-entrant: an exporter may run another inside its stages


def stage(label: str):
    def decorator(fn):
        fn._stage_label = label
        return fn

    return decorator


@dataclass
class ExportContext:
    model_id: str
    output: Path
    task_name: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    task: Task | None = None
    config: Any = None
    model: Any = None
    tokenizer: Any = None
    observer: InputObserver | None = None
    arguments: Any = None
    program: torch.export.ExportedProgram | None = None
    onnx_program: Any = None  # torch.onnx.ONNXProgram (ONNX backend)
    output_names: list[str] = field(default_factory=list)
    discrepancies: list[Any] = field(default_factory=list)
    staging: Path | None = None
    manifest: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)


class Exporter:
    backend = "base"

    @classmethod
    def stages(cls) -> list[tuple[str, str]]:
        """(label, method name) in run order."""
        found: list[tuple[str, str]] = []
        for klass in reversed(cls.__mro__):
            for name, fn in vars(klass).items():
                if hasattr(fn, "_stage_label") and all(n != name for _, n in found):
                    found.append((fn._stage_label, name))
        return found

    def run(self, ctx: ExportContext) -> ExportContext:
        check_options(**ctx.options)
        with _ONE_AT_A_TIME, quiet.third_party():
            with staged(ctx.output) as ctx.staging, flatten.registered():  # export and validation walk cache pytrees
                self._run_stages(ctx, self.stages())
        return ctx

    def _run_stages(self, ctx: ExportContext, stages) -> None:
        for i, (label, name) in enumerate(stages, 1):
            start = time.perf_counter()
            logger.info("[%d/%d] %s", i, len(stages), label)
            getattr(self, name)(ctx)
            ctx.timings[label] = round(time.perf_counter() - start, 3)

    # ── Stage: load ──
    @stage("load model")
    def load(self, ctx: ExportContext) -> None:
        if ctx.model is not None:  # an in-memory model (onnx_export_from_model): captured as it is
            ctx.config = ctx.model.config
            ctx.task = resolve_task(ctx.task_name, ctx.model, ctx.config)
            ctx.model.eval()
            return
        from transformers import AutoConfig

        path = Path(ctx.model_id)
        if not path.is_dir() and (path.is_absolute() or ctx.model_id.startswith(".") or path.exists()):
            raise ExportError(f"model directory not found: {ctx.model_id}")
        kwargs = {"trust_remote_code": ctx.options.get("trust_remote_code", False), **ctx.options.get("hub_options", {})}
        if path.is_dir() and not (path / "config.json").is_file():
            raise ExportError(f"cannot load {ctx.model_id}: no config.json in it")
        try:
            ctx.config = AutoConfig.from_pretrained(ctx.model_id, **kwargs)
        except (OSError, ValueError) as e:
            if "trust_remote_code" in str(e):  # nothing of the checkpoint's code was imported
                raise ExportError(f"{ctx.model_id} contains custom code: read it, then pass --trust-remote-code "
                                  "to run it") from e
            raise ExportError(f"cannot load {ctx.model_id}: {str(e).splitlines()[0][:400]}") from e
        if ctx.options.get("pad_token_id") is not None:  # --pad_token_id: used by capture, saved in config.json
            ctx.config.pad_token_id = ctx.options["pad_token_id"]
        ctx.task = resolve_task(ctx.task_name, ctx.model_id, ctx.config)
        auto_class = _tasks_auto_class(ctx.task.base)
        try:
            ctx.model = _load_model(auto_class, ctx.model_id, ctx.config, kwargs)
        except Exception as e:  # missing, truncated or mis-shaped weights: the checkpoint's problem, one line
            raise ExportError(f"cannot load weights of {ctx.model_id}: {_first_line(e)}") from e
        dtype = ctx.options.get("dtype")
        if dtype not in (None, "fp32"):  # --dtype: captured, exported and validated in that dtype
            ctx.model.to(getattr(torch, DTYPES[dtype]))
        ctx.tokenizer = preprocessor(ctx.model_id, kwargs)

    # ── Stage: capture ──
    @stage("capture generation")
    def capture(self, ctx: ExportContext) -> None:
        with forward_adapter(ctx.model, ctx.options.get("model_kwargs")), InputObserver(ctx.model, "model") as obs:
            ctx.task.spec.driver(ctx.model, ctx.tokenizer)
        ctx.observer = obs
        logger.info("    %s", obs.summary())

    # ── Stage: infer ──
    @stage("infer inputs and dynamic shapes")
    def infer(self, ctx: ExportContext) -> None:
        forward = inspect.signature(ctx.model.forward).parameters
        inputs = ctx.task.model_inputs(ctx.model)
        constants = ctx.task.spec.constants if ctx.task.with_past else {"use_cache": False}
        constants = {k: v for k, v in constants.items() if k in forward}
        constants.update(model_kwargs(ctx.model, ctx.options.get("model_kwargs")))
        # Text axes (batch, sequence) are dynamic by meaning, even if every call had one size; state models
        # (Mamba, hybrids) are stepped one token per call by design, so their sequence axis is 1.
        stepped = ctx.task.with_past and is_state_model(ctx.model)
        try:
            ctx.arguments = infer_arguments(ctx.observer.calls, inputs, constants, dynamic_sequence=not stepped)
        except CaptureError as e:
            raise PipelineError(str(e)) from e

    # ── Stage: torch.export ──
    @stage("torch.export")
    def export_program(self, ctx: ExportContext) -> None:
        args = ctx.arguments
        _plain_buffers(ctx.model)
        with patches.applied(options=_patch_options(ctx.options)), torch.no_grad(), seen_tokens_hook(ctx.model):
            with torch.fx.experimental._config.patch(backed_size_oblivious=True):
                ctx.program = torch.export.export(
                    ctx.model, (), kwargs=args.kwargs, dynamic_shapes=args.dynamic_shapes, strict=False
                )


def _first_line(error: Exception) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {' '.join(lines[:2])[:300]}" if lines else type(error).__name__


def _patch_options(options: dict) -> tuple[str, ...]:
    """Optional patches an export asks for: fused levels keep grouped key/value heads unrepeated."""
    from ..patches.transformers_gqa import FUSED_ATTENTION

    return (FUSED_ATTENTION,) if options.get("optimize_level") in ("O3", "O4") else ()


def _plain_buffers(model) -> None:
    """Buffers registered as `nn.Parameter` (falcon_mamba on transformers 4) are seen twice by
    torch.export's unlifting ("attribute already exists"): keep their values as plain tensors."""
    for module in model.modules():
        for name, buffer in module._buffers.items():
            if isinstance(buffer, torch.nn.Parameter):
                module._buffers[name] = buffer.data


def _load_model(auto_class, model_id: str, config, kwargs: dict):
    """transformers >= 5 runs MoE experts as grouped matmuls by default, a custom op ONNX cannot translate:
    ask for batched matmuls (models without experts refuse the option and load as they are)."""
    from transformers import PreTrainedModel

    if hasattr(PreTrainedModel, "_check_and_adjust_experts_implementation"):
        try:
            return auto_class.from_pretrained(model_id, config=config, experts_implementation="batched_mm", **kwargs).eval()
        except (ValueError, TypeError):
            pass
    return auto_class.from_pretrained(model_id, config=config, **kwargs).eval()


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
def forward_adapter(module, kwargs: dict | None, *others):
    """While capturing: every call of `module` (and `others`, e.g. an encoder generate calls directly) gets
    `kwargs` (`--model-kwargs`), and floating inputs in the module's dtype (`--dtype`: samples are float32)."""
    dtype = next((p.dtype for p in module.parameters() if p.is_floating_point()), torch.float32)
    fixed = model_kwargs(module, kwargs)

    def adapt(mod, args, call_kwargs):
        cast = lambda t: t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t  # noqa: E731
        if mod is module:
            call_kwargs = {**call_kwargs, **fixed}
        return tuple(cast(a) for a in args), {k: cast(v) for k, v in call_kwargs.items()}

    handles = [m.register_forward_pre_hook(adapt, with_kwargs=True, prepend=True) for m in (module, *others)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _tasks_auto_class(base_task: str):
    from optimum.exporters.tasks import TasksManager

    from legacy_bridge import transformers5

    transformers5.reapply()  # names optimum looks up on transformers (e.g. AutoModelForVision2Seq on 5.x)
    return TasksManager.get_model_class_for_task(base_task, library="transformers")
