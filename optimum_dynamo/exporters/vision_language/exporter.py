"""Vision-language models: the components observed during one real `generate` with an image,
each exported to ONNX and checked by onnxruntime on the calls it received.

    result = export_vlm("tiny-llava", "out", atol=1e-4)
    result.components["decoder_model"].discrepancies

`out/` then holds one directory per component (`model.onnx`, `model.onnx_data`), one manifest on top
(`optimum_dynamo.json`, a record per component under `components`), the model's config, generation
config and processor, and `vlm.json`, which tells the runtime (`optimum_dynamo.ORTModelForImageTextToText`)
how to join them:

- `vision_encoder`: the vision tower, `pixel_values` -> its outputs (hidden states included when
  the model asks for them);
- `multi_modal_projector`: image features in the text model's width, from the vision output the
  model feeds it (`vlm.json` names that output and how many leading positions are dropped);
- `embed_tokens`: token ids -> embeddings (Gemma3's scaling included);
- `decoder_model`: `inputs_embeds`, `attention_mask`, `position_ids`, past (+ `token_type_ids`
  when the model attends bidirectionally within an image) -> logits of the last position, presents.

The decoder is `TextDecoder`, the whole model called with embeddings instead of ids and pixels: its
calls are rebuilt from the language model's (the embeddings it got, images merged in) and the
outputs the model returned for the same steps.
"""

from __future__ import annotations

import copy
import inspect
import json
import logging
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import torch

from legacy_bridge import cache_argument

from ...capture import Call, InputObserver, observe
from ...capture.drivers import Generation, greedy
from ...errors import ExportError
from ...options import ExportOptions
from ..base import ExportContext, load_weights
from ..component import Component
from ..observed import ObservedOnnxExporter
from ..shared_weights import share_component_weights
from .image_features import default_image, image_components, image_sizes, other_image
from .prompts import default_prompt, image_placeholder, image_token, processor_inputs  # noqa: F401 (public here too)
from .steps import observe_steps

logger = logging.getLogger(__name__)

VLM_FILE = "vlm.json"
TASK = "image-text-to-text"
DECODER_INPUTS = ["inputs_embeds", "attention_mask", "position_ids", "past_key_values", "token_type_ids",
                  "deepstack_visual_embeds"]


class TextDecoder(torch.nn.Module):
    """`model` run from embeddings: the logits of the last position and the updated cache.

    `token_type_ids` (1 at image tokens) span the whole sequence, past included, like the attention
    mask; given, the model's own `create_masks_for_generate` builds masks in which the tokens of one
    image see each other (Gemma3). Positions come from the mask's length (batches without padding)."""

    def __init__(self, model: torch.nn.Module, language: torch.nn.Module | None = None):
        super().__init__()
        self.model = model
        params = inspect.signature(model.forward).parameters
        self.uses_token_types = "token_type_ids" in params and hasattr(type(model), "create_masks_for_generate")
        self.takes_cache_position = "cache_position" in params
        self.language = language  # given: the language model takes DeepStack features (Qwen3-VL)

    def _masks(self, inputs_embeds, attention_mask, position_ids, past_key_values, token_type_ids, cache_position):
        make = type(self.model).create_masks_for_generate
        values = dict(
            config=self.model.config, input_embeds=inputs_embeds, inputs_embeds=inputs_embeds,
            attention_mask=attention_mask, cache_position=cache_position, position_ids=position_ids,
            token_type_ids=token_type_ids, **{cache_argument.name(): past_key_values},
            # transformers 5.4 builds the image blocks' mask only when told this is the prompt; types span the whole
            # sequence, so the blocks are the same on every step (a new text token's row is unchanged by them)
            is_first_iteration=True,
        )
        return make(**{k: v for k, v in values.items() if k in inspect.signature(make).parameters})

    def forward(self, inputs_embeds, attention_mask, position_ids, past_key_values, token_type_ids=None,
                deepstack_visual_embeds=None):
        if deepstack_visual_embeds is not None:  # (batch, layers, positions, hidden), placed at the image positions
            with deepstack(self.language, deepstack_visual_embeds.transpose(0, 1)):
                return self.forward(inputs_embeds, attention_mask, position_ids, past_key_values, token_type_ids)
        if position_ids.dim() == 3:  # multimodal rows (Qwen2-VL) taken batch first: the capture's batch is axis 0
            position_ids = position_ids.transpose(0, 1)
        total, new = attention_mask.shape[1], inputs_embeds.shape[1]
        cache_position = torch.arange(total - new, total, device=inputs_embeds.device)
        mask = attention_mask
        if token_type_ids is not None:
            mask = self._masks(inputs_embeds, attention_mask, position_ids, past_key_values, token_type_ids, cache_position)
        extra = {"cache_position": cache_position} if self.takes_cache_position else {}
        out = self.model(
            inputs_embeds=inputs_embeds, attention_mask=mask, position_ids=position_ids,
            use_cache=True, logits_to_keep=1, **{cache_argument.name(): past_key_values}, **extra,
        )
        return {"logits": out.logits, "past_key_values": cache_argument.of(out)}


@contextmanager
def deepstack(language: torch.nn.Module, features: torch.Tensor):
    """`language` called with DeepStack `features` (layers, batch, positions, hidden) at every position (zeros
    where the model adds none), whatever its caller passes: the model passes none without pixels."""
    def inject(module, args, kwargs):
        mask = torch.ones(features.shape[1:3], dtype=torch.bool, device=features.device)
        return args, {**kwargs, "visual_pos_masks": mask, "deepstack_visual_embeds": features.flatten(1, 2)}

    handle = language.register_forward_pre_hook(inject, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def dense_deepstack(call: Call, length: int, batch: int, embeds: torch.Tensor) -> torch.Tensor:
    """A language model call's DeepStack features as the decoder takes them: (batch, layers, positions, hidden),
    each layer's rows at the image positions, zeros elsewhere and on steps without them."""
    rows, mask = call.kwargs.get("deepstack_visual_embeds"), call.kwargs.get("visual_pos_masks")
    dense = embeds.new_zeros(length, batch, embeds.shape[1], embeds.shape[2])
    if rows is not None:
        dense[:, mask] = torch.stack(list(rows)).to(embeds.dtype)
    return dense.transpose(0, 1)


@dataclass
class VlmExport:
    output: Path
    components: dict[str, Component] = field(default_factory=dict)
    layout: dict[str, Any] = field(default_factory=dict)  # the content of vlm.json
    tokens: torch.Tensor | None = None  # PyTorch's greedy tokens of the observed generate (new tokens only)


def image_token_id(config) -> int:
    value = getattr(config, "image_token_id", None)
    return value if value is not None else config.image_token_index


def decoder_calls(top: list[Call], language: list[Call], token_types: torch.Tensor | None,
                  deepstack_layers: int = 0) -> list[Call]:
    """`TextDecoder` calls from the language model's calls (embeddings, positions, past) and the
    model's outputs at the same steps. Steps without a mask (transformers 5 drops an all-ones mask)
    get ones; `token_types` (the prompt's) are extended with zeros over generated tokens; with
    `deepstack_layers`, each step gets its DeepStack features placed (`dense_deepstack`)."""
    if len(top) != len(language):
        raise ExportError(f"{len(top)} model calls but {len(language)} language model calls: steps do not pair")
    calls = []
    for step, inner in zip(top, language):
        embeds, past = inner.kwargs["inputs_embeds"], cache_argument.of(inner.kwargs)
        mask = step.kwargs.get("attention_mask")
        if mask is None:
            mask = torch.ones(embeds.shape[0], past.get_seq_length() + embeds.shape[1], dtype=torch.long)
        positions = inner.kwargs.get("position_ids")
        if positions is None:  # the language model counted them from its cache (MOSS): the same, explicit
            past_length = past.get_seq_length()
            positions = torch.arange(past_length, past_length + embeds.shape[1]).expand(embeds.shape[0], -1)
        positions = positions.transpose(0, 1) if positions.dim() == 3 else positions  # batch first (TextDecoder)
        kwargs = {"inputs_embeds": embeds, "attention_mask": mask, "position_ids": positions,
                  "past_key_values": past}
        if token_types is not None:
            grown = torch.nn.functional.pad(token_types, (0, max(0, mask.shape[1] - token_types.shape[1])))
            kwargs["token_type_ids"] = grown[:, : mask.shape[1]]
        if deepstack_layers:
            kwargs["deepstack_visual_embeds"] = dense_deepstack(inner, deepstack_layers, embeds.shape[0], embeds)
        calls.append(Call(kwargs, {"logits": step.outputs.logits, "past_key_values": cache_argument.of(step.outputs)}))
    return calls


def check_decoder(decoder: TextDecoder, call: Call, language: Call) -> None:
    """The decoder run from embeddings gives the model's logits at the prefill, else one line naming what else the
    language model got from the images (Qwen3-VL's deepstack features, added inside its first layers)."""
    from ...patches import applied

    with torch.no_grad(), applied():  # as exported; on a copy: the call's past is a cache the model updates in place
        logits = decoder(**copy.deepcopy(call.kwargs))["logits"][:, -1]
    diff = float((logits - call.outputs["logits"][:, -1]).abs().max())
    if diff <= 1e-4:
        return
    given = set(call.kwargs) | {"cache_position", "use_cache"}
    if "deepstack_visual_embeds" in given:  # placed at every position: the mask is the decoder's own
        given.add("visual_pos_masks")
    extra = sorted(k for k, v in language.kwargs.items() if k not in given and isinstance(v, (torch.Tensor, list, tuple)))
    if extra:
        raise ExportError(f"the language model also takes {extra} from the images (features added inside its layers), "
                          "which a decoder run from embeddings does not get: this model's export is not supported")
    raise ExportError(f"the decoder run from embeddings gives logits {diff:.3g} away from the model's at the prefill: "
                      "cannot export the decoder")


def load_processor(model_id: str, config, loading: dict):
    """The checkpoint's processor (tokenizer and image processor); refused in one line when it has none: the
    export runs the model on an image and a prompt, which only the processor can make."""
    from transformers import AutoProcessor

    try:
        processor = AutoProcessor.from_pretrained(model_id, **loading)
        if hasattr(processor, "image_processor"):
            return processor
        got = f"got a {type(processor).__name__} only"  # AutoProcessor's fallback when no processor class loads
    except Exception as e:
        got = type(e).__name__
    name = _processor_name(config)
    if _needs_torchvision(name):
        raise ExportError(f"cannot load {name} from {model_id} ({got}): it declares a video processor, and "
                          "transformers' video processors need torchvision, which is not installed (pip install torchvision)")
    raise ExportError(f"cannot load {name} from {model_id} ({got}): image-text-to-text exports run the model on an image "
                      "and a prompt, which need the checkpoint's processor files (tokenizer and image processor); save "
                      f"them beside the model ({name}.save_pretrained)")


def _needs_torchvision(name: str) -> bool:
    """Whether processor class `name` takes a video processor while torchvision (which every video processor of
    transformers needs) is missing."""
    import importlib.util

    import transformers

    cls = getattr(transformers, name, None)
    return (importlib.util.find_spec("torchvision") is None and cls is not None
            and "video_processor" in inspect.signature(cls.__init__).parameters)


def save_processor(processor, directory) -> None:
    """The processor's files; one built without a part (Qwen2-VL's video processor, which needs torchvision)
    saves the parts it has (its image processor and tokenizer)."""
    names = processor.get_attributes() if hasattr(processor, "get_attributes") else processor.attributes
    parts = [getattr(processor, name, None) for name in names]
    if all(part is not None for part in parts):
        processor.save_pretrained(directory)
        return
    for part in parts:
        if part is not None:
            part.save_pretrained(directory)


def _processor_name(config) -> str:
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

    return PROCESSOR_MAPPING_NAMES.get(getattr(config, "model_type", ""), None) or "the processor"


def _load(model_or_dir, processor):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    if isinstance(model_or_dir, (str, Path)):
        model = AutoModelForImageTextToText.from_pretrained(model_or_dir).eval()
        processor = processor or AutoProcessor.from_pretrained(model_or_dir)
        return model, processor
    if processor is None:
        raise ExportError("pass the processor with a model object")
    return model_or_dir.eval(), processor


def holds_embeddings(module: torch.nn.Module, embeddings: torch.nn.Module) -> bool:
    """Whether `module` is the language model: it holds the input embeddings."""
    try:
        return module.get_input_embeddings() is embeddings
    except (AttributeError, NotImplementedError):  # 4.57's towers, Janus' VQ-VAE
        return False


def inner_parts(inner: torch.nn.Module, embeddings: torch.nn.Module, called: set[str] | None = None) -> dict[str, str]:
    """The inner model's children by what they do, not their names (`language_model` / `text_model`,
    `vision_tower` / `vision_model`, `multi_modal_projector` / `connector`): the language model holds the
    input embeddings, the vision tower takes `pixel_values`, the projector is the one other child with weights.
    `called`: the children a `generate` with an image ran (Janus' image-generation parts take no part). Returns
    role -> child name (no vision tower with several: the model's `get_image_features` is then the image graph)."""
    children = {n: m for n, m in inner.named_children() if called is None or n in called}
    language = [n for n, m in children.items() if holds_embeddings(m, embeddings)]
    vision = [n for n, m in children.items() if "pixel_values" in inspect.signature(m.forward).parameters]
    if not vision:  # a tower over patches (Qwen2-VL's `visual`, forward(hidden_states, grid_thw)): by its config
        kind = type(getattr(inner.config, "vision_config", None))
        vision = [n for n, m in children.items() if type(getattr(m, "config", None)) is kind]
    if len(language) != 1 or not vision:
        raise ExportError(f"cannot tell the language model and the vision tower among {list(dict(inner.named_children()))}: "
                          f"the export takes models whose {type(inner).__name__} holds both, the language model holding "
                          "the input embeddings (image features replacing image-token rows)")
    if len(vision) > 1:  # two towers on the image (DeepSeek-VL-Hybrid): `get_image_features` is the one image graph
        return dict(language=language[0])
    parts = dict(language=language[0], vision=vision[0])
    others = [n for n, m in children.items() if n not in language + vision and any(True for _ in m.parameters())]
    if len(others) == 1:
        parts["projector"] = others[0]
    return parts


def uses_steps(model) -> bool:
    """Whether the model's images reach its text other than as rows replacing image tokens: no inner model
    holding a language model (the input embeddings) and a vision tower (GIT, Idefics, Kosmos-2). Those export as
    the forward `generate` steps (`steps`)."""
    inner = getattr(model, "model", None)
    if not isinstance(inner, torch.nn.Module):
        return True
    try:
        inner_parts(inner, model.get_input_embeddings())
    except ExportError:
        return True
    return False


def observed_parts(model, inputs: dict, max_new_tokens: int) -> tuple[dict, torch.Tensor]:
    """A greedy `generate` with every child of the inner model observed: (observers by role — `top`, `embed`,
    `language`, `vision`, `projector` where there is one —, the tokens). Roles go to the children it ran."""
    inner, embeddings = model.model, model.get_input_embeddings()
    children = {n: m for n, m in inner.named_children() if m is not embeddings and any(True for _ in m.parameters())}
    with observe(top=model, embed=embeddings, **{f"child:{n}": m for n, m in children.items()}) as obs, torch.no_grad():
        tokens = model.generate(**inputs, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, do_sample=False)
    parts = inner_parts(inner, embeddings, {n for n in children if obs[f"child:{n}"].calls})
    return {"top": obs["top"], "embed": obs["embed"], **{role: obs[f"child:{n}"] for role, n in parts.items()}}, tokens


def observe_vlm(model, processor, image=None, prompt: str | None = None, max_new_tokens: int = 4):
    """One greedy `generate` on (`image`, `prompt`) under observation: (plan, layout, that `Generation`). `plan`:
    component -> (observer, inputs or None, constants or None), as `ObservedOnnxExporter` takes it."""
    inner = getattr(model, "model", None)
    if not isinstance(inner, torch.nn.Module):  # BLIP, GIT: images reach the text by cross-attention or as a prefix
        raise ExportError(f"{type(model).__name__} has no inner model (`.model`) holding a language model and a "
                          "vision tower: the export takes models whose image features replace image-token rows of "
                          "the input embeddings")
    prompt = prompt or default_prompt(processor, model.config)
    placeholders = [t for t in (getattr(processor, "boi_token", None), image_token(processor)) if t]
    if not any(t in prompt for t in placeholders):
        raise ExportError(f"the prompt has no image token: put the processor's image placeholder in it, e.g. {default_prompt(processor)!r}")
    inputs = processor_inputs(model, processor, image or default_image(), prompt)
    obs, tokens = observed_parts(model, inputs, max_new_tokens)
    for name, observer in obs.items():
        logger.info("    %s", observer.summary())
    if not obs["language"].calls:
        raise ExportError("generate never ran the language model")

    stacked = obs["language"].calls[0].kwargs.get("deepstack_visual_embeds")  # Qwen3-VL: rows per early layer
    decoder = TextDecoder(model, obs["language"].module if stacked is not None else None)
    image_id = image_token_id(model.config)
    token_types = None
    if decoder.uses_token_types:  # the processor's (PaliGemma: 0 on the prefix), else 1 at image tokens (Gemma3)
        token_types = inputs.get("token_type_ids", (inputs["input_ids"] == image_id)).long()
    decoder_obs = InputObserver(decoder, "decoder", calls=decoder_calls(
        obs["top"].calls, obs["language"].calls, token_types, len(stacked) if stacked is not None else 0))
    check_decoder(decoder, decoder_obs.calls[0], obs["language"].calls[0])
    positions = obs["language"].calls[0].kwargs["position_ids"]  # the prompt is not padded: 0.. or 1.. (PaliGemma)

    decoder_inputs = [n for n in DECODER_INPUTS if (n != "token_type_ids" or token_types is not None)
                      and (n != "deepstack_visual_embeds" or stacked is not None)]
    join: dict[str, Any] = {}
    if positions.dim() == 3:  # multimodal rotary positions (Qwen2-VL: a text row, then t, h, w rows)
        join["rope_rows"] = positions.shape[0]
    if stacked is not None:
        join["deepstack_layers"] = len(stacked)
    other = None
    if image_sizes(inputs["pixel_values"], inputs.get("image_sizes")) == "pixels":  # a second size: the graph takes any
        other = processor_inputs(model, processor, other_image(image or default_image()), prompt)
    plan = {
        **image_components(model, processor, inputs, obs, image_id, join, other),
        "embed_tokens": (obs["embed"], None, None),
        "decoder_model": (decoder_obs, decoder_inputs, {}),
    }
    layout = {
        "model_type": model.config.model_type,
        "components": {name: f"{name}/model.onnx" for name in plan},
        "image_token_id": image_id,
        "vocab_size": model.config.get_text_config().vocab_size,
        **join,
        "position_offset": int(positions.reshape(-1)[0]),
        "token_type_ids": token_types is not None,
    }
    given = {k: v for k, v in inputs.items() if k != "labels"}  # PaliGemma's processor adds training targets
    return plan, layout, Generation(given, greedy(max_new_tokens), tokens[:, inputs["input_ids"].shape[1] :])


def export_vlm(
    model_or_dir,
    output: str | Path,
    *,
    processor=None,
    image=None,
    prompt: str | None = None,
    max_new_tokens: int = 4,
    atol: float | None = None,
) -> VlmExport:
    """Observe one greedy `generate` on (`image`, `prompt`), export the four components to
    `output/<component>/model.onnx` and check each with onnxruntime on its recorded calls."""
    from ...tasks import supported_task

    model, processor = _load(model_or_dir, processor)
    exporter = VlmOnnxExporter(image=image, prompt=prompt, max_new_tokens=max_new_tokens)
    ctx = ExportContext(output=Path(output), options=ExportOptions.make(atol=atol), model_id=str(getattr(
        model, "name_or_path", "") or type(model).__name__), task=supported_task(TASK), model=model,
        processor=processor)
    exporter.run(ctx)  # all components or nothing
    return VlmExport(Path(output), {part.name: part for part in ctx.components}, exporter.layout, exporter.tokens)


def check_mapped(model_type: str) -> None:
    """ExportError for a model type outside transformers' image-text-to-text mapping, naming the task its model class
    serves where that is text generation (phi4_multimodal: a causal LM taking images and audio)."""
    from transformers.models.auto import modeling_auto

    if model_type in modeling_auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES:
        return
    causal = model_type in modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    raise ExportError(f"{model_type} is not in transformers' image-text-to-text mapping" + (
        ": its model class is a causal LM, export it with --task text-generation-with-past" if causal else ""))


class VlmOnnxExporter(ObservedOnnxExporter):
    """The four components, observed in one `generate` with an image, one directory each, beside the model's
    config, generation config, processor and `vlm.json` (one manifest on top). The CLI's export
    (`--task image-text-to-text`) loads the model and its processor; `export_vlm` passes them."""

    layout_file = VLM_FILE  # how the runtime joins the components

    def __init__(self, *, image=None, prompt: str | None = None, max_new_tokens: int = 4):
        super().__init__({}, directories=True)
        self.image, self.prompt, self.max_new_tokens = image, prompt, max_new_tokens
        self.layout: dict[str, Any] = {}
        self.tokens: torch.Tensor | None = None

    def load(self, ctx: ExportContext) -> None:
        if ctx.target is None:  # export_vlm: model and processor given
            return
        target = ctx.target
        ctx.model_id, ctx.config, ctx.task = target.model_id, target.config, target.task
        check_mapped(ctx.config.model_type)
        ctx.processor = load_processor(ctx.model_id, ctx.config, ctx.options.loading)  # before the weights
        if target.model is not None:
            ctx.model = target.model.eval()
            return
        ctx.model = load_weights(ctx)

    def components(self, ctx: ExportContext) -> list[Component]:
        observe_model = observe_steps if uses_steps(ctx.model) else observe_vlm  # GIT: the stepped forward
        self.parts, self.layout, generation = observe_model(ctx.model, ctx.processor, self.image, self.prompt,
                                                            self.max_new_tokens)
        self.tokens, ctx.generations = generation.tokens, [generation]  # the runtime's generate is checked on it
        parts = super().components(ctx)
        for part in parts:
            path = PurePosixPath(self.layout["components"][part.name])  # where vlm.json says the graph is
            part.directory, part.stem = str(path.parent), path.stem
            if getattr(part.observer.module, "image_sizes", None) is not None:  # a graph taking image sizes takes
                part.dynamic_batch = False  # one image: the batch axis stays 1
        return parts

    def save(self, ctx: ExportContext) -> None:
        super().save(ctx)
        if shared := self.layout.get("weights"):  # the step graphs: the weights they hold in common, stored once
            share_component_weights(ctx.staging, ctx.components, shared)

    def copy_files(self, ctx: ExportContext) -> None:
        (ctx.staging / self.layout_file).write_text(json.dumps(self.layout, indent=2))
        ctx.model.config.save_pretrained(ctx.staging)
        if getattr(ctx.model, "generation_config", None) is not None:  # ORTModelForImageTextToText's defaults
            ctx.model.generation_config.save_pretrained(ctx.staging)
        save_processor(ctx.processor, ctx.staging)
