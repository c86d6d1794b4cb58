"""The image graphs of a vision-language model: how the model's images become the rows that replace its image
tokens, as graphs the runtime (`ORTModelForImageTextToText`) can run.

- the vision tower and the projector as two graphs, when the projector's output is what the model merged
  (`VisionEncoder` + the projector's own calls; LLaVA, Gemma3, Idefics3);
- the model's `get_image_features` as one graph (`ImageFeatures`: Aya Vision, InternVL, LLaVA-Next, Mistral 3);
- a tower over flattened patches with a grid per image (`GridImageFeatures`: Qwen2-VL, Qwen2.5-VL, Qwen3-VL).

`image_components` picks one from what the capture saw.
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import torch

from ...capture import Call, InputObserver
from ...errors import ExportError
from ...flatten import flat_outputs
from . import grid_tower_v4, image_tiles


def default_image(size: int = 48, seed: int = 0):
    """A synthesized RGB image (random pixels), for observation runs without a real one."""
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def other_image(image):
    """`image` at another size (width doubled, height kept): a second size for the image graph's capture."""
    return image.resize((image.width * 2, image.height))


def feature_source(vision: Call, projector: Call) -> tuple[str, int]:
    """(vision output name, leading positions dropped) that gave the projector its input."""
    fed = next(v for v in projector.kwargs.values() if isinstance(v, torch.Tensor))
    for name, value in flat_outputs(vision.outputs).items():
        skip = value.shape[1] - fed.shape[1] if value.dim() == fed.dim() else -1
        if skip >= 0 and value.shape[2:] == fed.shape[2:] and torch.equal(value[:, skip:], fed):
            return name, skip
    raise ExportError("no output of the vision tower is the projector's input: cannot join the two components")


class VisionEncoder(torch.nn.Module):
    """The vision tower called with `pixel_values` and the plain keywords the model passed it (transformers 5
    asks for hidden states through `**kwargs`, which torch.export cannot take as constants)."""

    def __init__(self, tower: torch.nn.Module, keywords: dict[str, Any]):
        super().__init__()
        self.tower, self.keywords = tower, keywords

    def forward(self, pixel_values):
        return self.tower(pixel_values=pixel_values, **self.keywords)

    @classmethod
    def observed(cls, observer: InputObserver) -> InputObserver:
        """The tower's calls as calls of this wrapper (keywords: those with one plain value in every call)."""
        first = observer.calls[0].kwargs
        keywords = {
            k: v for k, v in first.items()
            if isinstance(v, (bool, int, float, str)) and all(c.kwargs.get(k, object()) == v for c in observer.calls)
        }
        calls = [Call({"pixel_values": c.kwargs["pixel_values"]}, c.outputs) for c in observer.calls]
        wrapper = cls(observer.module, keywords)
        dropped = {k for c in observer.calls for k, v in c.kwargs.items() if isinstance(v, torch.Tensor)} - {"pixel_values"}
        if dropped:  # e.g. Idefics3's patch_attention_mask, all ones for whole tiles: the graph must not need it
            with torch.no_grad():
                same = all(_same_outputs(wrapper(c.kwargs["pixel_values"]), c.outputs) for c in calls)
            if not same:
                raise ExportError(f"the vision tower's outputs depend on {sorted(dropped)}, which its graph would not "
                                  "take: cannot export the vision encoder")
        return InputObserver(wrapper, "vision_encoder", calls=calls)


class Projector(torch.nn.Module):
    """The projector called with the tower's features only: every other tensor it was given was a mask of ones
    over the features' leading axes (Idefics2's resampler mask for whole images), rebuilt here as ones."""

    def __init__(self, projector: torch.nn.Module, features: str, ones: dict[str, tuple[int, torch.dtype]]):
        super().__init__()
        self.projector, self.features, self.ones = projector, features, ones

    def forward(self, features):
        masks = {k: torch.ones(features.shape[:dims], dtype=dtype) for k, (dims, dtype) in self.ones.items()}
        return self.projector(**{self.features: features}, **masks)

    @classmethod
    def observed(cls, observer: InputObserver) -> InputObserver | None:
        """The projector's calls as calls of this wrapper; None when a tensor besides the features is not such a
        mask (then the model's `get_image_features` is the one image graph)."""
        call = observer.calls[0]
        tensors = {k: v for k, v in call.kwargs.items() if isinstance(v, torch.Tensor)}
        if not tensors:
            return None
        if len(tensors) == 1:  # the projector's own graph (LLaVA, Gemma3)
            return observer
        features, ones = next(iter(tensors)), {}
        for name, value in list(tensors.items())[1:]:
            if value.shape != tensors[features].shape[:value.dim()] or not bool((value == 1).all()):
                return None
            ones[name] = (value.dim(), value.dtype)
        if len(call.kwargs) != len(tensors):  # other arguments this wrapper would not pass
            return None
        return InputObserver(cls(observer.module, features, ones), observer.name,
                             calls=[Call({"features": tensors[features]}, call.outputs)])


def _same_outputs(got, recorded) -> bool:
    got, recorded = flat_outputs(got), flat_outputs(recorded)
    return got.keys() == recorded.keys() and all(torch.allclose(got[k], recorded[k], atol=1e-6) for k in got)


class ImageFeatures(torch.nn.Module):
    """The model's own `get_image_features(pixel_values)`: whatever the family does between the vision
    tower and the text model (feature selection, pixel shuffle, projection, scaling) is in the graph.
    Returns one row per image token, the images in order (transformers 5 returns the rows as the
    output's `pooler_output`, several families a list with one tensor per image)."""

    def __init__(self, model: torch.nn.Module, image_sizes: str | list | None = None):
        super().__init__()
        self.model = model  # the inner model (`model.model`), which has `get_image_features` in 4.57 and 5
        # models taking `image_sizes` get one image per call: "pixels" (its own height and width, dynamic:
        # Pixtral) or a size fixed at export (LLaVA-Next: tiles and unpadding are loops over the sizes)
        self.image_sizes, self.multiple = image_sizes, None
        if image_sizes == "pixels":  # sides in whole (merged) patches, as the processor makes them
            self.multiple = model.config.vision_config.patch_size * getattr(model.config, "spatial_merge_size", 1)

    def forward(self, pixel_values, **pixels):
        extra = dict(pixels)  # the model's other pixel tensors (DeepSeek-VL-Hybrid's high_res_pixel_values)
        if self.image_sizes == "pixels":
            for side in pixel_values.shape[-2:]:  # whole merged patches: the model's slices and splits then agree
                torch._check(side % self.multiple == 0)
            extra["image_sizes"] = [tuple(pixel_values.shape[-2:])]
        elif self.image_sizes is not None:
            extra["image_sizes"] = self.image_sizes
        out = self.model.get_image_features(pixel_values=pixel_values, **extra)
        if not isinstance(out, (torch.Tensor, list, tuple)):
            out = out.pooler_output
        if isinstance(out, (list, tuple)):
            out = torch.cat([f.reshape(-1, f.shape[-1]) for f in out])
        return out.reshape(-1, out.shape[-1])

    @classmethod
    def observed(cls, model, inputs: dict, language: Call, image_id: int, other: dict | None = None) -> InputObserver:
        """One call: the prompt's pixels -> the rows the model merged at its image tokens (read from the
        language model's embeddings at the prefill), checked against this wrapper in PyTorch. (The pixels
        come from the processor: transformers 5's `generate` encodes the image before the first step.)
        With sizes from the pixels, `other` (the processor's output for an image of another size) adds a
        second call, so the image's height and width are dynamic."""
        if not hasattr(model.model, "get_image_features"):
            raise ExportError(f"{type(model.model).__name__} has no get_image_features and no vision tower + projector "
                              "pair whose output is what the model merged: cannot export the image component")
        pixels = inputs["pixel_values"]
        given = {"pixel_values": pixels, **other_pixels(model.model.get_image_features, inputs)}
        wrapper = taking(cls, list(given))(model.model, image_sizes(pixels, inputs.get("image_sizes")))
        calls = [Call(given, merged_rows(wrapper, given, language, inputs["input_ids"], image_id, "image"))]
        if wrapper.image_sizes == "pixels" and other is not None:
            with torch.no_grad():
                calls.append(Call({"pixel_values": other["pixel_values"]}, wrapper(other["pixel_values"])))
        return InputObserver(wrapper, "image_features", calls=calls)


class GridImageFeatures(torch.nn.Module):
    """A vision tower over flattened patches with a grid per image (`image_grid_thw`: Qwen2-VL's family),
    called with what transformers' `precompute_export_inputs` derives from the grid (`cu_seqlens`, the
    rotary `position_ids`, window indices...): those are the graph's inputs beside the patches, so the
    number of images and their sizes stay dynamic. Returns one row per image token, the images in order."""

    def __init__(self, tower: torch.nn.Module):
        super().__init__()
        self.tower = tower

    def forward(self, pixel_values, cu_seqlens, position_ids, window_index=None, cu_window_seqlens=None,
                interp_indices=None, interp_weights=None):
        if grid_tower_v4.covers(self.tower):  # transformers 4.57: the tower takes no precomputed inputs
            return grid_tower_v4.run_tower(self.tower, pixel_values, cu_seqlens, position_ids, window_index,
                                           cu_window_seqlens, interp_indices, interp_weights)
        extra = dict(window_index=window_index, cu_window_seqlens=cu_window_seqlens, interp_indices=interp_indices,
                     interp_weights=interp_weights)
        out = self.tower(pixel_values, grid_thw=None, cu_seqlens=cu_seqlens, position_ids=position_ids,
                         **{k: v for k, v in extra.items() if v is not None})
        if isinstance(out, torch.Tensor):
            return out
        if getattr(out, "deepstack_features", None):  # Qwen3-VL: early layers' rows too, (layers, rows, hidden)
            return {"output": out.pooler_output, "deepstack_features": torch.stack(list(out.deepstack_features))}
        return out.pooler_output

    @staticmethod
    def grid_inputs(tower: torch.nn.Module, grid_thw: torch.Tensor) -> dict[str, torch.Tensor]:
        """The tensors transformers precomputes from the grid for this tower (also run by the runtime on the
        tower built on the meta device)."""
        if grid_tower_v4.covers(tower):
            return grid_tower_v4.grid_inputs(tower, grid_thw)
        try:
            from transformers.exporters.utils import precompute_export_inputs
        except ImportError:
            raise ExportError("this vision tower derives its attention bounds and rotary positions from the image grid "
                              "inside its forward; transformers >= 5 precomputes them (precompute_export_inputs): "
                              "upgrade transformers to export it") from None
        inputs = {"grid_thw": grid_thw}
        precompute_export_inputs(tower, inputs)
        return {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor) and k != "grid_thw"}

    @classmethod
    def observed(cls, model, processor, tower: torch.nn.Module, inputs: dict, language: Call, image_id: int) -> InputObserver:
        """The prompt's images, checked against the rows the model merged, and a second call on two images of
        other sizes (a square and a wide one), so that the capture sees the patch and image counts vary."""
        wrapper = cls(tower)
        merged = language.kwargs["inputs_embeds"][inputs["input_ids"] == image_id]
        other = processor.image_processor(images=[default_image(40, seed=7), default_image(56, seed=8).crop((0, 0, 56, 24))],
                                          return_tensors="pt")
        calls = []
        for pixels, grid in ((inputs["pixel_values"], inputs["image_grid_thw"]), (other["pixel_values"], other["image_grid_thw"])):
            kwargs = {"pixel_values": pixels, **cls.grid_inputs(tower, grid)}
            with torch.no_grad():
                calls.append(Call(kwargs, wrapper(**kwargs)))
        rows = flat_outputs(calls[0].outputs)
        if rows["output"].shape != merged.shape or not torch.allclose(rows["output"], merged, atol=1e-5):
            raise ExportError(f"the vision tower gives {tuple(rows['output'].shape)} rows that are not the "
                              f"{tuple(merged.shape)} image rows the model merged into its embeddings: cannot export the "
                              "image component")
        given = language.kwargs.get("deepstack_visual_embeds")
        if ("deepstack_features" in rows) != (given is not None) or (given is not None and not torch.allclose(
                rows["deepstack_features"], torch.stack(list(given)), atol=1e-5)):
            raise ExportError("the vision tower's DeepStack features are not those the language model got: cannot "
                              "export the image component")
        return InputObserver(wrapper, "image_features", calls=calls)


def taking(cls, names: list[str]):
    """`cls` whose forward declares `names` (torch.export matches inputs and dynamic shapes to the signature; the
    extra ones arrive through its `**kwargs`)."""
    keyword = inspect.Parameter.POSITIONAL_OR_KEYWORD
    if [p.name for p in inspect.signature(cls.forward).parameters.values() if p.kind is keyword][1:] == names:
        return cls
    signature = inspect.Signature([inspect.Parameter(n, keyword) for n in ["self", *names]])

    def forward(self, *args, **kwargs):
        return cls.forward(self, *args, **kwargs)

    forward.__signature__ = signature
    return type(cls.__name__, (cls,), {"forward": forward})


def merged_rows(wrapper, given: dict, language: Call, input_ids: torch.Tensor, token_id: int, kind: str) -> torch.Tensor:
    """The rows the model merged at its `kind` tokens (read from the language model's embeddings at the prefill),
    checked against `wrapper` on the processor's tensors in PyTorch; one error line when they differ."""
    merged = language.kwargs["inputs_embeds"][input_ids == token_id]
    with torch.no_grad():
        rows = wrapper(**given)
    if rows.shape != merged.shape or not torch.allclose(rows, merged, atol=1e-5):
        raise ExportError(f"get_{kind}_features gives {tuple(rows.shape)} rows that are not the {tuple(merged.shape)} "
                          f"{kind} rows the model merged into its embeddings: cannot export the {kind} component")
    return merged


def other_pixels(get_image_features, inputs: dict) -> dict[str, torch.Tensor]:
    """The processor's pixel tensors besides `pixel_values` that `get_image_features` takes (`*pixel_values`)."""
    names = inspect.signature(get_image_features).parameters
    return {k: v for k, v in inputs.items() if k != "pixel_values" and k.endswith("pixel_values") and k in names}


def image_sizes(pixels: torch.Tensor, sizes: torch.Tensor | None) -> str | list | None:
    """How the image graph gets the `image_sizes` the model takes: None (it takes none), "pixels" (one image
    whose size is its pixels': the size is a dynamic axis) or the observed sizes, fixed at export."""
    if sizes is None:
        return None
    if len(sizes) != 1:
        raise ExportError(f"{len(sizes)} images in the observed prompt: models taking image_sizes are exported from one")
    if pixels.dim() == 4 and list(pixels.shape[-2:]) == sizes[0].tolist():
        return "pixels"
    return sizes.tolist()


def padded_images(pixels: torch.Tensor, tower_pixels: torch.Tensor) -> dict:
    """`{"padded_images": True}` when the processor's pixels have an images axis (batch, images, C, H, W) that
    the model flattened before its tower, dropping the all-zero images the processor padded with (Idefics3,
    SmolVLM): the runtime does the same, so the tower's graph takes a dynamic number of images (tiles)."""
    if pixels.dim() == tower_pixels.dim():
        return {}
    flat = pixels.flatten(0, 1)
    if pixels.dim() != tower_pixels.dim() + 1 or not torch.equal(flat[flat.flatten(1).any(1)], tower_pixels):
        raise ExportError(f"pixel_values of shape {tuple(pixels.shape)} reached the vision tower as "
                          f"{tuple(tower_pixels.shape)}, not as its non-zero images: cannot join the image graphs")
    return {"padded_images": True}


def _tiled_projector(inner, projected: InputObserver, inputs: dict, merged: torch.Tensor) -> InputObserver | None:
    """The projector with the packing's newline row as a second output, when packing its observed output tile by
    tile (`image_tiles.pack`) gives the rows the model merged; else None."""
    sizes = inputs.get("image_sizes")
    if sizes is None or not image_tiles.covers(inner):
        return None
    call = projected.calls[0]
    newline = getattr(inner, image_tiles.NEWLINE)
    with torch.no_grad():
        counts = image_tiles.tile_counts(inner, sizes, inputs.get("batch_num_images"))
        rows = image_tiles.pack(inner, call.outputs, sizes, counts, newline)
    if rows.shape != merged.shape or not torch.equal(rows, merged):
        return None
    features = next(v for v in call.kwargs.values() if isinstance(v, torch.Tensor))
    return InputObserver(image_tiles.TiledProjector(projected.module, newline), projected.name,
                         calls=[Call({"features": features}, {"output": call.outputs, image_tiles.NEWLINE: newline.detach()})])


def image_components(model, processor, inputs: dict, obs: dict, image_id: int, layout: dict,
                     other: dict | None = None) -> dict:
    """The vision tower and the projector as two graphs when the projector's output is what the model merged
    and its input one of the tower's outputs (LLaVA, Gemma3; `layout` gets the join); else the model's
    `get_image_features` as one graph (a pixel shuffle or a scaling between them: Aya Vision, PaliGemma 4.57)."""
    merged = obs["language"].calls[0].kwargs["inputs_embeds"][inputs["input_ids"] == image_id]
    if "image_grid_thw" in inputs:  # patches with a grid per image (Qwen2-VL): one graph, its tower ends with its merger
        layout["grid_inputs"] = [n for n in inspect.signature(GridImageFeatures.forward).parameters if n != "self"]
        layout["vision_module"] = next(n for n, m in model.named_modules() if m is obs["vision"].module)
        return {"image_features": (GridImageFeatures.observed(model, processor, obs["vision"].module, inputs,
                                                              obs["language"].calls[0], image_id), None, None)}
    vision = obs["vision"].calls if "vision" in obs else []
    projector = obs["projector"].calls if "projector" in obs else []
    projected = Projector.observed(obs["projector"]) if len(projector) == 1 else None
    if len(vision) == 1 and projected is not None and isinstance(projector[0].outputs, torch.Tensor):
        rows = projector[0].outputs.reshape(-1, merged.shape[-1])
        try:
            source, skip = feature_source(vision[0], projector[0])
        except ExportError:
            source = None
        if source is not None and rows.shape == merged.shape and torch.equal(rows, merged):
            layout.update(vision_output=source, vision_skip=skip,
                          **padded_images(inputs["pixel_values"], vision[0].kwargs["pixel_values"]))
            return {"vision_encoder": (VisionEncoder.observed(obs["vision"]), None, None),
                    "multi_modal_projector": (projected, None, None)}
        tiled = source is not None and _tiled_projector(model.model, projected, inputs, merged)
        if tiled:  # LLaVA-Next: the tiles' features packed per image by its size, in the runtime
            layout.update(vision_output=source, vision_skip=skip, tiles=True)
            return {"vision_encoder": (VisionEncoder.observed(obs["vision"]), None, None),
                    "multi_modal_projector": (tiled, None, None)}
    observer = ImageFeatures.observed(model, inputs, obs["language"].calls[0], image_id, other)
    names = list(observer.calls[0].kwargs)
    if len(names) > 1:
        layout["image_inputs"] = names[1:]
    sizes = observer.module.image_sizes
    if sizes is not None:  # one image per call; the runtime loops over the images
        fixed = {"image_size": sizes[0]} if sizes != "pixels" else {"image_multiple": observer.module.multiple}
        layout.update(image_sizes="pixels" if sizes == "pixels" else "fixed", **fixed)
    return {"image_features": (observer, None, None)}
