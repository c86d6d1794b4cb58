"""Task resolution through optimum's task registry, and what each task needs from capture."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

from legacy_bridge import cache_argument
from legacy_bridge.ort_speech_lm import speech_lm

from .capture import (drive_forward, drive_multiple_choice, drive_seq2seq_generation, drive_text_and_images,
                      drive_text_generation)
from .errors import ExportError, PipelineError


@dataclass(frozen=True)
class TaskSpec:
    """A task as data: how the capture runs the model, what loads the export, which inputs the graph takes."""

    driver: Callable | None  # runs the model the way users do, under observation (None: the exporter does)
    runtime_class: str  # class that loads the export, in `runtime_module`
    constants: dict[str, Any] = field(default_factory=dict)  # fixed kwargs of the exported forward
    encoder_decoder: bool = False  # exported as encoder + decoder graphs (exporters/seq2seq.py)
    vision_language: bool = False  # exported as vision, projector, embedding and decoder graphs (exporters/vision_language/exporter.py)
    speech_language: bool = False  # exported as audio, embedding and decoder graphs (exporters/speech_language.py)
    runtime_module: str = "optimum.onnxruntime"
    auto_class: str | None = None  # transformers' auto class that loads the model (None: optimum's for the task)
    inputs: tuple[str, ...] | None = None  # the graph's inputs (None: the runtime class's forward says)
    streams: bool = True  # weights streamed from the checkpoint when big (docs: Big models)
    reads: tuple[str, ...] = ()  # outputs the runtime class reads by name (the model must return them)
    methods: tuple[str, ...] = ()  # the auto class's model for the config has these (a form its mapping does not name)


# optimum has no runtime class for these tasks: its generic one feeds the graph's inputs by name and returns its
# outputs, named after transformers' output fields
_GENERIC = "ORTModelForCustomTasks"
_LOGITS = ("logits",)

# Tasks the --dynamo path exports; the key is optimum's task name without "-with-past".
SUPPORTED: dict[str, TaskSpec] = {
    "text-generation": TaskSpec(drive_text_generation, "ORTModelForCausalLM", {"use_cache": True}),
    "feature-extraction": TaskSpec(drive_forward, "ORTModelForFeatureExtraction", reads=("last_hidden_state",)),
    "fill-mask": TaskSpec(drive_forward, "ORTModelForMaskedLM", reads=_LOGITS),
    "text-classification": TaskSpec(drive_forward, "ORTModelForSequenceClassification", reads=_LOGITS),
    "token-classification": TaskSpec(drive_forward, "ORTModelForTokenClassification", reads=_LOGITS),
    "question-answering": TaskSpec(drive_forward, "ORTModelForQuestionAnswering",
                                   reads=("start_logits", "end_logits")),
    "multiple-choice": TaskSpec(drive_multiple_choice, "ORTModelForMultipleChoice", reads=_LOGITS),
    "image-classification": TaskSpec(drive_forward, "ORTModelForImageClassification", reads=_LOGITS),
    "zero-shot-image-classification": TaskSpec(drive_text_and_images, "ORTModelForZeroShotImageClassification",
                                               reads=("logits_per_image", "logits_per_text", "text_embeds",
                                                      "image_embeds")),
    "semantic-segmentation": TaskSpec(drive_forward, "ORTModelForSemanticSegmentation"),
    # optimum's pipeline task: semantic segmenters here, mask-per-query models in VARIANTS
    "image-segmentation": TaskSpec(drive_forward, "ORTModelForSemanticSegmentation",
                                   auto_class="AutoModelForSemanticSegmentation"),
    "object-detection": TaskSpec(drive_forward, _GENERIC, inputs=("pixel_values",)),
    "depth-estimation": TaskSpec(drive_forward, _GENERIC, inputs=("pixel_values",)),
    "audio-classification": TaskSpec(drive_forward, "ORTModelForAudioClassification", reads=_LOGITS),
    "audio-frame-classification": TaskSpec(drive_forward, "ORTModelForAudioFrameClassification", reads=_LOGITS),
    "audio-xvector": TaskSpec(drive_forward, "ORTModelForAudioXVector", reads=("logits", "embeddings")),
    "text2text-generation": TaskSpec(drive_seq2seq_generation, "ORTModelForSeq2SeqLM", encoder_decoder=True),
    "automatic-speech-recognition": TaskSpec(drive_seq2seq_generation, "ORTModelForSpeechSeq2Seq",
                                             encoder_decoder=True, auto_class="AutoModelForSpeechSeq2Seq"),
    "image-to-text": TaskSpec(drive_seq2seq_generation, "ORTModelForVision2Seq", encoder_decoder=True),
    # optimum-onnx has no runtime class for it: ours
    "image-text-to-text": TaskSpec(None, "ORTModelForImageTextToText", vision_language=True,
                                   runtime_module="optimum_dynamo"),
}

# Tasks of other libraries than transformers: (library, task) -> how it is exported
LIBRARY_TASKS: dict[tuple[str, str], TaskSpec] = {
    # the model's modules in order (pooling, normalization): optimum's outputs for it (sentence_embeddings.py)
    ("sentence_transformers", "feature-extraction"): TaskSpec(
        drive_forward, _GENERIC, inputs=("input_ids", "attention_mask", "token_type_ids"), streams=False,
        auto_class="optimum_dynamo.sentence_embeddings.SentenceEmbedder"),
    # pixel values at the model's input size in, logits out (timm_models.py); optimum's class loads it
    ("timm", "image-classification"): TaskSpec(
        drive_forward, "ORTModelForImageClassification", reads=_LOGITS, streams=False,
        auto_class="optimum_dynamo.timm_models.TimmClassifier"),
}


# A library's task when none is given: optimum's inference for its models
LIBRARY_DEFAULT_TASKS = {"sentence_transformers": "feature-extraction", "timm": "image-classification"}


def library_task(task: str | None, library: str) -> str:
    """The task of a library's model: its default when none is given (sentence-transformers models are embedding
    models: optimum's "sentence-similarity" is the same export)."""
    if task in (None, "auto") or (library == "sentence_transformers" and task == "sentence-similarity"):
        return LIBRARY_DEFAULT_TASKS[library]
    return task


# Other forms of a task, for models its first form does not fit (speech recognition: CTC models, and speech LLMs,
# decoders that transformers maps among its speech seq2seq models: optimum's class loads their components through
# legacy_bridge.ort_speech_lm)
VARIANTS: dict[str, list[TaskSpec]] = {
    # dual encoders (CLIP, BLIP, SigLIP, ...): their forward takes texts and images and returns both embeddings,
    # not the `last_hidden_state` optimum's feature-extraction class reads; those outside the zero-shot mapping
    # (GroupViT, OWL-ViT) are told by the text and image embedding methods of their model
    "feature-extraction": [
        TaskSpec(drive_text_and_images, _GENERIC, auto_class=auto, inputs=("input_ids", "attention_mask", "pixel_values"),
                 methods=methods)
        for auto, methods in (("AutoModelForZeroShotImageClassification", ()),
                              ("AutoModel", ("get_text_features", "get_image_features")))
    ],
    # instance / panoptic segmenters (DETR, MaskFormer, Mask2Former, EoMT, ...): a class and a mask per query,
    # which optimum's semantic-segmentation class does not return
    "image-segmentation": [
        TaskSpec(drive_forward, _GENERIC, inputs=("pixel_values",), auto_class=auto)
        for auto in ("AutoModelForUniversalSegmentation", "AutoModelForInstanceSegmentation")
    ],
    "automatic-speech-recognition": [
        TaskSpec(drive_forward, "ORTModelForCTC", auto_class="AutoModelForCTC", reads=_LOGITS),
        TaskSpec(None, "ORTModelForSpeechSeq2Seq", speech_language=True, auto_class="AutoModelForSeq2SeqLM"),
    ],
}


def _maps(auto_class: str | None, config) -> bool:
    import transformers

    return auto_class is not None and "." not in auto_class and type(config) in getattr(transformers, auto_class)._model_mapping


def _fits(spec: TaskSpec, config) -> bool:
    """The form of the task serves the model: its auto class maps the config to a model with the form's `methods`,
    and an encoder-decoder form takes encoder-decoder models only (transformers maps speech LLMs, decoders, among its
    speech seq2seq models)."""
    import transformers

    if not _maps(spec.auto_class, config):
        return False
    if spec.methods:  # resolved only then: a model class's import may need packages the task does not
        try:
            model_class = getattr(transformers, spec.auto_class)._model_mapping[type(config)]
            if not all(hasattr(model_class, m) for m in spec.methods):
                return False
        except ImportError:  # the class needs a package that is not installed: loading it will say so
            return False
    if spec.speech_language:
        return speech_lm(config)
    return not spec.encoder_decoder or bool(getattr(config, "is_encoder_decoder", False))


ENCODER_DECODER_TASKS = [name for name, spec in SUPPORTED.items() if spec.encoder_decoder]
VISION_LANGUAGE_TASKS = [name for name, spec in SUPPORTED.items() if spec.vision_language]


@dataclass(frozen=True)
class Task:
    name: str  # as optimum writes it, e.g. "text-generation-with-past"
    base: str
    with_past: bool
    spec: TaskSpec

    def runtime_class(self) -> type:
        import importlib

        return getattr(importlib.import_module(self.spec.runtime_module), self.spec.runtime_class)

    def runtime_inputs(self) -> list[str]:
        """Tensor inputs the runtime class can feed (its forward's parameters, or the task's own list)."""
        if self.spec.inputs is not None:
            return list(self.spec.inputs)
        params = inspect.signature(self.runtime_class().forward).parameters
        skip = {"self", "use_cache", "kwargs", "return_dict"}
        if not self.with_past:
            skip.add("past_key_values")
        return [p for p in params if p not in skip and params[p].kind is not inspect.Parameter.VAR_KEYWORD]


    def model_inputs(self, model) -> list[str]:
        """The forward's parameters the exported graph takes, in forward order: what the runtime class
        feeds; for state models (one token per call) also their cache kwarg (`cache_params` for Mamba)
        and `cache_position` when the forward takes it (transformers 4). A text model whose forward takes its
        `attention_mask` only through `**kwargs` (OmniASR's, for its language model) takes it there."""
        from .capture.samples import mask_through_kwargs
        from .capture.stepping import cache_kwarg, is_state_model

        forward = inspect.signature(model.forward).parameters
        wanted = set(self.runtime_inputs())
        if "past_key_values" in wanted:  # the runtime's name; the model's own may be another (`cache` on 5.24+)
            wanted.add(cache_kwarg(model))
        if self.with_past and is_state_model(model):
            wanted |= {cache_kwarg(model), "cache_position"}
        through_kwargs = "attention_mask" in wanted and mask_through_kwargs(forward)
        names = []
        for name, param in forward.items():
            if name in wanted:
                names.append(name)
            elif param.kind is inspect.Parameter.VAR_KEYWORD and through_kwargs:
                names.append("attention_mask")
        return names


def _tasks_manager():
    from optimum.exporters.tasks import TasksManager

    return TasksManager


def infer_task(model_id: str, config) -> str:
    """optimum's inference, else the config's architectures (new models optimum does not list; optimum infers
    nothing from a local directory): a causal LM, else an architecture of transformers'
    AutoModelForImageTextToText (encoder-decoders excepted: their task is image-to-text), else a speech LLM."""
    try:
        return _tasks_manager().infer_task_from_model(model_id, library_name="transformers")
    except Exception:
        architectures = getattr(config, "architectures", None) or []
        if any(arch.endswith("ForCausalLM") for arch in architectures):
            return "text-generation"
        if not getattr(config, "is_encoder_decoder", False) and set(architectures) & _image_text_to_text():
            return "image-text-to-text"
        if speech_lm(config):
            return "automatic-speech-recognition"
        raise ExportError(f"cannot infer the task of {model_id}: pass --task")


def _image_text_to_text() -> set[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    return set(MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES.values())


def with_past(task: str, config=None) -> str:
    """`task` with "-with-past" where generation keeps a cache: encoder-decoder tasks, and text generation
    (when `config` is given: if the model's forward takes a cache)."""
    if task in ENCODER_DECODER_TASKS or (
        task == "text-generation" and (config is None or cache_argument.renamed("past_key_values") in _forward_params(config))
    ):
        return task + "-with-past"
    return task


def optimum_task(task: str | None, model_id, config) -> str:
    """The task as optimum's registry names it (synonyms mapped), with "-with-past" where generation keeps a
    cache; inferred when None or "auto". Unknown tasks are the user's error."""
    if task in (None, "auto"):
        task = with_past(infer_task(model_id, config), config)
    manager = _tasks_manager()
    base = manager.map_from_synonym(task.removesuffix("-with-past"))
    if base not in manager.get_all_tasks():
        raise ExportError(f"unknown task {task!r}; known tasks: {', '.join(sorted(manager.get_all_tasks()))}")
    return base + ("-with-past" if task.endswith("-with-past") else "")


def supported_task(name: str, config=None, library: str = "transformers") -> Task:
    """optimum's task `name`, for the tasks the dynamo path exports (others are a pipeline limit: the CLI
    falls back); with `config`, the task's form for that model (`VARIANTS`); another `library`'s own rows."""
    base = name.removesuffix("-with-past")
    if library != "transformers":
        if (library, base) not in LIBRARY_TASKS:
            known = ", ".join(t for lib, t in LIBRARY_TASKS if lib == library)
            raise PipelineError(f"task {base!r} of {library} models is not supported by --dynamo yet (supported: {known})")
        return Task(name, base, name != base, LIBRARY_TASKS[library, base])
    if base not in SUPPORTED:
        raise PipelineError(f"task {base!r} is not supported by --dynamo yet (supported: {', '.join(SUPPORTED)})")
    spec = SUPPORTED[base]
    if config is not None and not _fits(spec, config):
        spec = next((v for v in VARIANTS.get(base, []) if _fits(v, config)), spec)
    return Task(name, base, name != base, spec)


def resolve_task(task: str | None, model_id, config) -> Task:
    return supported_task(optimum_task(task, model_id, config), config)


def _forward_params(config) -> set[str]:
    from transformers import AutoModelForCausalLM

    try:
        cls = AutoModelForCausalLM._model_mapping[type(config)]
    except KeyError:
        return set()
    return set(inspect.signature(cls.forward).parameters)
