"""`ORTModelForImageTextToText`: the components written by `export_vlm` as one optimum ORTModel with
transformers' `generate` (greedy, sampling, beam search), batches of left-padded prompts, any number
of images per prompt (none included).

    model = ORTModelForImageTextToText.from_pretrained("out")
    processor = AutoProcessor.from_pretrained("out")
    processor.tokenizer.padding_side = "left"
    tokens = model.generate(**processor(images=images, text=prompts, return_tensors="pt", padding=True))

`forward` is one step of the language model: on the prefill (no past), `vision_encoder` and
`multi_modal_projector` turn `pixel_values` into one row per image token (in order: the images of the
first prompt first), which replace the embeddings of those tokens; the decoder then runs on the
embeddings. Decode steps embed the new tokens only. The past is a tuple of (key, value) pairs per
layer, in the decoder's input order, so beams reorder it with `index_select` on the batch axis.

optimum-onnx has no class for image-text-to-text models (0.1.0 and its main branch); the file layout
is `export_vlm`'s (docs/vlm.md).
"""

from __future__ import annotations

import inspect
import itertools
import json
import shutil
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import torch
from huggingface_hub.constants import HUGGINGFACE_HUB_CACHE
from legacy_bridge import cache_argument
from legacy_bridge import positions as position_rules
from onnxruntime import InferenceSession
from optimum.onnxruntime.base import ORTParentMixin, ORTSessionMixin
from optimum.onnxruntime.modeling import ORTModel
from optimum.onnxruntime.utils import prepare_providers_and_provider_options
from transformers import AutoModelForImageTextToText, GenerationConfig
from transformers.generation import GenerationMixin
from transformers.modeling_outputs import CausalLMOutputWithPast

from .image_text_to_text_steps import ModelSteps
from .processors import saved_processors

VLM_FILE = "vlm.json"
MANIFEST_FILE = "optimum_dynamo.json"
PAST, PRESENT = "past_key_values.", "present."


class ORTComponent(ORTSessionMixin):
    """One graph of the model: torch tensors in, a dict of torch tensors out (no I/O binding)."""

    def __init__(self, session: InferenceSession):
        self.initialize_ort_attributes(session, use_io_binding=False)

    @property
    def first_input(self) -> str:
        return next(iter(self.input_names))

    def forward(self, **inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        feed = self._prepare_onnx_inputs(True, inputs)
        return self._prepare_onnx_outputs(True, self.session.run(None, feed))


class ORTModelForImageTextToText(ORTParentMixin, ORTModel, GenerationMixin):
    """An image-text-to-text model (Gemma3, LLaVA) exported by `export_vlm`, run by onnxruntime."""

    auto_model_class = AutoModelForImageTextToText
    export_task = "image-text-to-text"  # optimum's registry reads the auto class as image-to-text on transformers 5
    main_input_name = "input_ids"
    _is_stateful = False
    _supports_cache_class = False
    _library_name = "transformers"
    layout_file = VLM_FILE  # how the components join (written by the exporter)

    def __init__(
        self,
        *,
        config=None,
        sessions: dict[str, InferenceSession] = None,
        layout: dict[str, Any] = None,
        generation_config: GenerationConfig | None = None,
        model_save_dir: str | Path | TemporaryDirectory | None = None,
        preprocessors: list | None = None,
    ):
        super(ORTModel, self).__init__(model=sessions["decoder_model"], config=config, preprocessors=preprocessors)
        self.layout = layout
        self.generation_config = generation_config or GenerationConfig.from_model_config(config)
        self.components = {name: ORTComponent(session) for name, session in sessions.items()}
        self.embed_tokens, self.decoder = self.components.get("embed_tokens"), self.components["decoder_model"]
        self.initialize_ort_attributes(parts=list(self.components.values()))
        self.key_value_input_names = [n for n in self.decoder.input_names if n.startswith(PAST)]
        self.uses_token_types = "token_type_ids" in self.decoder.input_names

        self._model_save_dir_tempdirectory_instance = None
        if isinstance(model_save_dir, TemporaryDirectory):
            self._model_save_dir_tempdirectory_instance = model_save_dir
            model_save_dir = model_save_dir.name
        self.model_save_dir = Path(model_save_dir or self.decoder.path.parent.parent)

    # ------------------------------------------------------------------ loading and saving
    @classmethod
    def _from_pretrained(
        cls,
        model_id: str | Path,
        config,
        *,
        subfolder: str = "",
        revision: str = "main",
        force_download: bool = False,
        local_files_only: bool = False,
        trust_remote_code: bool = False,
        cache_dir: str = HUGGINGFACE_HUB_CACHE,
        token: bool | str | None = None,
        provider: str = "CPUExecutionProvider",
        providers=None,
        provider_options=None,
        session_options=None,
        use_io_binding: bool | None = None,
        generation_config: GenerationConfig | None = None,
        model_save_dir: str | Path | TemporaryDirectory | None = None,
        **kwargs,
    ) -> "ORTModelForImageTextToText":
        if getattr(config, "is_encoder_decoder", False):  # T5Gemma 2: optimum's seq2seq layout, pixels to the encoder
            from .image_text_to_text_seq2seq import ORTModelForImageTextToTextSeq2Seq

            return ORTModelForImageTextToTextSeq2Seq._from_pretrained(
                model_id, config, subfolder=subfolder, revision=revision, force_download=force_download,
                local_files_only=local_files_only, trust_remote_code=trust_remote_code, cache_dir=cache_dir,
                token=token, provider=provider, providers=providers, provider_options=provider_options,
                session_options=session_options, use_io_binding=use_io_binding, generation_config=generation_config,
                model_save_dir=model_save_dir, **kwargs)
        if use_io_binding:
            raise ValueError("ORTModelForImageTextToText runs without I/O binding: pass use_io_binding=False or None")
        hub = dict(revision=revision, force_download=force_download, local_files_only=local_files_only,
                   token=token, cache_dir=cache_dir)
        layout_path = cls._cached_file(model_id, filename=cls.layout_file, subfolder=subfolder, **hub)
        layout = json.loads(layout_path.read_text())
        providers, provider_options = prepare_providers_and_provider_options(
            provider=provider, providers=providers, provider_options=provider_options
        )
        if "weights" in layout:  # one external-data file the step graphs share
            shared = Path(subfolder, layout["weights"])
            cls._cached_file(model_id, filename=shared.name, subfolder=shared.parent.as_posix(), **hub)
        sessions = {}
        for name in layout["components"]:
            relative = Path(subfolder, layout["components"][name])
            path = cls._cached_file(model_id, filename=relative.name, subfolder=relative.parent.as_posix(), **hub)
            sessions[name] = InferenceSession(path, providers=providers, provider_options=provider_options,
                                              sess_options=session_options)
        if generation_config is None:
            try:
                generation_config = GenerationConfig.from_pretrained(model_id, subfolder=subfolder, **hub)
            except OSError:
                generation_config = GenerationConfig.from_model_config(config)
        if layout.get("steps"):  # GIT, Idefics, Kosmos-2: the stepped forward, a graph per kind of step
            cls = ORTModelForImageTextToTextSteps
        return cls(config=config, sessions=sessions, layout=layout, generation_config=generation_config,
                   model_save_dir=model_save_dir or layout_path.parent, preprocessors=saved_processors(layout_path.parent))

    @classmethod
    def _export(cls, model_id, config, dynamo: bool | None = None, **kwargs):
        """`from_pretrained(model_id, export=True)`: the dynamo export (`--task image-text-to-text`) into a
        temporary directory, then loaded; optimum's torchscript exporter has none for these models."""
        if dynamo is False:
            raise ValueError("ORTModelForImageTextToText: the torchscript exporter has no export for "
                             "image-text-to-text models; pass dynamo=True (or leave it out)")
        from ..integration import export_for_runtime

        return export_for_runtime(cls, model_id, config, **kwargs)

    def _save_config(self, save_directory):
        self.config.save_pretrained(save_directory)
        self.generation_config.save_pretrained(save_directory)

    def _save_pretrained(self, save_directory: str | Path):
        """Each component's directory (graphs, external data; the step graphs share one) and the layout file."""
        save_directory = Path(save_directory)
        directories = {Path(self.layout["components"][name]).parent: part.path.parent
                       for name, part in self.components.items()}  # the step graphs share one
        for relative, source in directories.items():
            shutil.copytree(source, save_directory / relative, dirs_exist_ok=True)
        (save_directory / self.layout_file).write_text(json.dumps(self.layout, indent=2))
        if (self.model_save_dir / MANIFEST_FILE).is_file():
            shutil.copy(self.model_save_dir / MANIFEST_FILE, save_directory / MANIFEST_FILE)

    # ------------------------------------------------------------------ the steps
    def image_features(self, pixel_values: torch.Tensor, image_grid_thw: torch.Tensor | None = None,
                       image_sizes: torch.Tensor | None = None,
                       pixel_attention_mask: torch.Tensor | None = None, batch_num_images: torch.Tensor | None = None,
                       **pixels: torch.Tensor) -> torch.Tensor:
        """(image tokens of all images, hidden): the rows that replace the image tokens (`pixels`: the layout's
        other pixel tensors, `image_inputs`)."""
        if "grid_inputs" in self.layout:
            return self._grid_features(pixel_values, image_grid_thw)["output"]
        if self.layout.get("tiles"):  # tiles by the image's size, packed per image here (LLaVA-Next)
            return self._tiled_features(pixel_values, image_sizes, batch_num_images)
        if self.layout.get("image_sizes"):  # a graph of one image, its size from its pixels or fixed at export
            if image_sizes is None:
                raise ValueError("this model's image graph needs image_sizes (the processor's) beside pixel_values")
            sizes = image_sizes.tolist()
            for size in sizes:  # the sizes first: they decide the pixels' shape (LLaVA-Next's tile count)
                self._check_size(size)
            self._check_image_size(pixel_values)
            return torch.cat([self._one_image(pixel_values[i : i + 1], size) for i, size in enumerate(sizes)])
        self._check_image_size(pixel_values)
        if self.layout.get("padded_images"):
            pixel_values = self._real_images(pixel_values, pixel_attention_mask)
        if "image_features" in self.components:  # the model's `get_image_features`
            missing = [k for k in self.layout.get("image_inputs", []) if pixels.get(k) is None]
            if missing:
                raise ValueError(f"this model's image graph needs {', '.join(missing)} (the processor's) beside pixel_values")
            return self.components["image_features"](pixel_values=pixel_values, **pixels)["output"]
        features = self._projected(pixel_values)["output"]  # the split layout: tower, projector
        return features.reshape(-1, features.shape[-1])

    def _projected(self, pixel_values: torch.Tensor) -> dict[str, torch.Tensor]:
        """The projector's outputs on the vision tower's selected features."""
        vision = self.components["vision_encoder"](pixel_values=pixel_values)
        selected = vision[self.layout["vision_output"]][:, self.layout["vision_skip"] :]
        projector = self.components["multi_modal_projector"]
        return projector(**{projector.first_input: selected})

    def _tiled_features(self, pixel_values: torch.Tensor, image_sizes: torch.Tensor | None,
                        batch_num_images: torch.Tensor | None) -> torch.Tensor:
        """Each image's tiles (their count from its size; LLaVA-OneVision: one tile for the images of a prompt with
        several) through the tower and the projector, packed by the model's own function on the meta model: the grid
        unpadded to the image's size, the newline rows added."""
        if image_sizes is None:
            raise ValueError("this model's image graphs need image_sizes (the processor's) beside pixel_values")
        from ..exporters.vision_language import image_tiles

        inner = self._meta_model().model
        self._check_image_size(pixel_values)
        counts = image_tiles.tile_counts(inner, image_sizes, batch_num_images)
        tiles = image_tiles.real_tiles(pixel_values, counts)
        out = self._projected(tiles)
        return image_tiles.pack(inner, out["output"], image_sizes, counts, out[image_tiles.NEWLINE])

    def _grid_features(self, pixel_values: torch.Tensor, image_grid_thw: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """Flattened patches: the tower's inputs derived from the grids (any size); the rows, and the DeepStack
        features (layers, rows, hidden) where the model has them."""
        if image_grid_thw is None:
            raise ValueError("pixel_values without image_grid_thw: pass the processor's image_grid_thw")
        from ..exporters.vision_language.image_features import GridImageFeatures

        tower = self._meta_model().get_submodule(self.layout["vision_module"])
        feed = {"pixel_values": pixel_values, **GridImageFeatures.grid_inputs(tower, image_grid_thw)}
        graph = self.components["image_features"]
        return graph(**{k: v for k, v in feed.items() if k in graph.input_names})

    def _check_size(self, size: list[int]) -> None:
        """An image size the graph takes (whole merged patches, or the size fixed at export), else one line."""
        if self.layout["image_sizes"] == "pixels":
            multiple = self.layout["image_multiple"]
            if size[0] % multiple or size[1] % multiple:
                raise ValueError(f"an image of {size[0]}x{size[1]}: the exported image graph takes heights and widths "
                                 f"that are multiples of {multiple} (whole merged patches); resize it with the model's processor")
        elif size != self.layout["image_size"]:
            fixed = "x".join(map(str, self.layout["image_size"]))
            raise ValueError(f"an image of {size[0]}x{size[1]}: the exported image graph takes images of {fixed} only "
                             "(its tiles and unpadding are fixed at export); resize the image before the processor")

    def _one_image(self, pixels: torch.Tensor, size: list[int]) -> torch.Tensor:
        """One image's rows, cropped to its size where the size is its pixels' (the processor pads a batch to its
        largest image)."""
        if self.layout["image_sizes"] == "pixels":
            pixels = pixels[..., : size[0], : size[1]]
        return self.components["image_features"](pixel_values=pixels)["output"]

    @staticmethod
    def _real_images(pixel_values: torch.Tensor, pixel_attention_mask: torch.Tensor | None) -> torch.Tensor:
        """(batch, images, C, H, W) -> (real images, C, H, W): the all-zero images the processor padded with are
        dropped, as the model does. The graph takes whole images: a mask hiding part of a real one is refused."""
        flat = pixel_values.flatten(0, 1)
        real = flat.flatten(1).any(1)
        if pixel_attention_mask is not None and not pixel_attention_mask.flatten(0, 1)[real].all():
            raise ValueError("pixel_attention_mask masks part of an image: the exported image graph takes whole images "
                             "(tiles) without a pixel mask")
        return flat[real]

    def _check_image_size(self, pixel_values: torch.Tensor) -> None:
        """Images of the size the image graph was exported with (the manifest's fixed axes), else one line: never
        resized here. With `padded_images` (and tiles, the processor's way), pixel_values have an images axis more
        than the graph."""
        graph = self.components.get("image_features") or self.components["vision_encoder"]
        dims = list(graph.input_shapes["pixel_values"])
        stacked = self.layout.get("padded_images") or (self.layout.get("tiles") and pixel_values.dim() == len(dims) + 1)
        rank = len(dims) + int(bool(stacked))
        if rank != pixel_values.dim() or any(
                isinstance(d, int) and d != size for d, size in zip(dims[1:], pixel_values.shape[rank - len(dims) + 1 :])):
            fixed = "x".join(str(d) if isinstance(d, int) else "any" for d in dims[1:])
            raise ValueError(f"pixel_values of shape {tuple(pixel_values.shape)}: the exported image graph takes images "
                             f"of {fixed} (fixed at export); resize them with the model's processor")

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        ids = torch.where(input_ids >= self.layout["vocab_size"], 0, input_ids)  # out-of-vocabulary image tokens
        return self.embed_tokens(**{self.embed_tokens.first_input: ids})["output"]

    def _meta_model(self):
        """The model built on the meta device (no weights): transformers' own functions of the config (the rotary
        index of Qwen2-VL's positions, the tower's precomputed inputs) run on it."""
        if getattr(self, "_meta", None) is None:
            with torch.device("meta"):
                self._meta = AutoModelForImageTextToText.from_config(self.config)
        return self._meta

    def rope_positions(self, input_ids, attention_mask, positions, prefill: bool, image_grid_thw=None,
                       mm_token_type_ids=None) -> torch.Tensor:
        """Multimodal rotary positions (t, h, w rows; a text row first where the model takes it). The prefill asks
        the model's own `get_rope_index`; its offset from the text positions (the rope delta) is kept per row for
        the decode steps, as the model does."""
        if prefill:
            rows = positions[None].expand(3, -1, -1)
            if image_grid_thw is not None:
                inner = self._meta_model().model
                given = dict(input_ids=input_ids, image_grid_thw=image_grid_thw, attention_mask=attention_mask,
                             mm_token_type_ids=mm_token_type_ids)
                params = inspect.signature(inner.get_rope_index).parameters
                rows, _ = inner.get_rope_index(**{k: v for k, v in given.items() if k in params})
            self._rope_deltas = rows.amax(dim=(0, 2)) - positions[:, -1]
        else:
            rows = positions[None].expand(3, -1, -1) + self._rope_deltas[None, :, None]
        if self.layout["rope_rows"] == 4:
            rows = torch.cat([positions[None], rows])
        return rows.transpose(0, 1)  # the decoder takes them batch first

    def prompt_embeddings(self, input_ids: torch.Tensor, pixel_values: torch.Tensor | None,
                          **image_inputs: torch.Tensor | None) -> torch.Tensor:
        """The prompt's embeddings, the image tokens' rows replaced by the images' (`image_inputs`: the
        processor's other image tensors the layout needs: `image_grid_thw`, `image_sizes`, `pixel_attention_mask`)."""
        return self.prompt_inputs(input_ids, pixel_values, **image_inputs)["inputs_embeds"]

    def prompt_inputs(self, input_ids: torch.Tensor, pixel_values: torch.Tensor | None,
                      **image_inputs: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """The decoder's image-dependent inputs at the prefill: `inputs_embeds` (`prompt_embeddings`), and with
        DeepStack (Qwen3-VL) `deepstack_visual_embeds`, the early layers' rows at the image tokens."""
        embeds = self.embed(input_ids)
        is_image = input_ids == self.layout["image_token_id"]
        inputs = {"inputs_embeds": embeds}
        if "deepstack_layers" in self.layout:
            inputs["deepstack_visual_embeds"] = self._no_deepstack(*input_ids.shape)
        if pixel_values is None:
            if is_image.any():
                raise ValueError(f"{int(is_image.sum())} image tokens in the prompt but no pixel_values")
            return inputs
        if "deepstack_layers" in self.layout:
            out = self._grid_features(pixel_values, image_inputs.get("image_grid_thw"))
            rows = out["output"]
            inputs["deepstack_visual_embeds"].transpose(0, 1)[:, is_image] = out["deepstack_features"].to(embeds.dtype)
        else:
            rows = self.image_features(pixel_values, **image_inputs)
        if rows.shape[0] != is_image.sum():
            raise ValueError(f"{int(is_image.sum())} image tokens in the prompt but {rows.shape[0]} image features")
        embeds[is_image] = rows.to(embeds.dtype)
        return inputs

    def _no_deepstack(self, batch: int, length: int) -> torch.Tensor:
        """DeepStack features of positions without an image: zeros (batch, layers, positions, hidden)."""
        hidden = self.config.get_text_config().hidden_size
        return torch.zeros((batch, self.layout["deepstack_layers"], length, hidden), dtype=self.dtype, device=self.device)

    def empty_past(self, batch: int) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
        """Zero-length past for the prefill; the other axes are the graph's fixed sizes."""
        empty = []
        for name in self.key_value_input_names:
            dims = self.decoder.input_shapes[name]
            shape = [batch if axis == 0 else 0 if not isinstance(d, int) else d for axis, d in enumerate(dims)]
            empty.append(torch.zeros(shape, dtype=self.dtype, device=self.device))
        return _pairs(empty)

    def forward(
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.LongTensor | None = None,
        pixel_values: torch.FloatTensor | None = None,
        past_key_values: tuple | None = None,
        position_ids: torch.LongTensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        image_grid_thw: torch.LongTensor | None = None,
        mm_token_type_ids: torch.LongTensor | None = None,
        image_sizes: torch.LongTensor | None = None,
        pixel_attention_mask: torch.LongTensor | None = None,
        batch_num_images: torch.LongTensor | None = None,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        prefill = past_key_values is None
        if prefill:
            pixels = {k: kwargs.get(k) for k in self.layout.get("image_inputs", [])}
            inputs = self.prompt_inputs(input_ids, pixel_values, image_grid_thw=image_grid_thw,
                                        image_sizes=image_sizes, pixel_attention_mask=pixel_attention_mask,
                                        batch_num_images=batch_num_images, **pixels)
        else:  # decode steps: the image is in the past
            inputs = {"inputs_embeds": self.embed(input_ids)}
            if "deepstack_layers" in self.layout:
                inputs["deepstack_visual_embeds"] = self._no_deepstack(*input_ids.shape)
        return self.decode(input_ids, inputs, attention_mask, past_key_values, position_ids, token_type_ids=token_type_ids,
                           image_grid_thw=image_grid_thw if pixel_values is not None else None,
                           mm_token_type_ids=mm_token_type_ids)

    def decode(self, input_ids, inputs: dict, attention_mask, past_key_values, position_ids, *, token_type_ids=None,
               image_grid_thw=None, mm_token_type_ids=None) -> CausalLMOutputWithPast:
        """One run of the decoder on the step's `inputs` (embeddings; the prefill's with the media rows placed): the
        mask, positions and past filled in as transformers' `generate` makes them."""
        batch, length = input_ids.shape
        prefill = past_key_values is None
        if prefill:
            past_key_values = self.empty_past(batch)
        flat_past = [t for pair in past_key_values for t in pair]
        if attention_mask is None:
            past_length = max(t.shape[-2] for t in flat_past) if flat_past else 0
            attention_mask = torch.ones((batch, past_length + length), dtype=torch.long, device=input_ids.device)
        total = attention_mask.shape[1]
        if position_ids is None:  # from the mask, as transformers does for left padding (or as the layout says)
            position_ids = position_rules.positions(self.layout.get("positions", "mask"), input_ids, attention_mask,
                                                    total - length)
        position_ids = position_ids + self.layout.get("position_offset", 0)  # PaliGemma counts from 1
        if "rope_rows" in self.layout:  # 3-D positions (Qwen2-VL)
            position_ids = self.rope_positions(input_ids, attention_mask, position_ids, prefill, image_grid_thw,
                                               mm_token_type_ids)
        feed = {**inputs, "attention_mask": attention_mask, "position_ids": position_ids,
                **dict(zip(self.key_value_input_names, flat_past))}
        if self.uses_token_types:
            feed["token_type_ids"] = self._token_types(input_ids, token_type_ids, prefill, total)
        out = self.decoder(**feed)
        present, _ = self._split_outputs(out)
        return CausalLMOutputWithPast(logits=out["logits"], **{cache_argument.name(): present})

    def _split_outputs(self, out: dict[str, torch.Tensor]) -> tuple[tuple, dict[str, torch.Tensor]]:
        """A graph's outputs: the present as (key, value) pairs in the past's input order, and the others but the
        logits."""
        present = [n.replace(PAST, PRESENT, 1) for n in self.key_value_input_names]
        others = {n: v for n, v in out.items() if n != "logits" and n not in present}
        return _pairs([out[n] for n in present]), others

    def _token_types(self, input_ids, token_type_ids, prefill: bool, total: int) -> torch.Tensor:
        """Types over the whole sequence (1 at image tokens of the prompt). A decode step's new tokens are
        text (0); the past's types then change nothing (only image tokens attend to later ones), zeros."""
        types = torch.zeros((input_ids.shape[0], total), dtype=torch.long, device=input_ids.device)
        if prefill:
            prompt = token_type_ids if token_type_ids is not None else input_ids == self.layout["image_token_id"]
            types[:, -input_ids.shape[1] :] = prompt[:, -input_ids.shape[1] :].long()
        return types

    @staticmethod
    def _reorder_cache(past_key_values: tuple, beam_idx: torch.LongTensor) -> tuple:
        return tuple(tuple(t.index_select(0, beam_idx.to(t.device)) for t in pair) for pair in past_key_values)

    def _expand_inputs_for_generation(self, expand_size=1, is_encoder_decoder=False, input_ids=None, **kwargs):
        """Beams and `num_return_sequences` repeat each prompt; where images are rows of patches with a grid each
        (Qwen2-VL), each prompt's block of patches and grids is repeated (not each row)."""
        if "grid_inputs" not in self.layout:  # rows are images: transformers' expansion
            return super()._expand_inputs_for_generation(expand_size, is_encoder_decoder, input_ids, **kwargs)
        pixels, grids = kwargs.pop("pixel_values", None), kwargs.pop("image_grid_thw", None)
        input_ids, kwargs = super()._expand_inputs_for_generation(expand_size, is_encoder_decoder, input_ids, **kwargs)
        if pixels is not None and grids is not None and expand_size > 1:
            tokens = (input_ids[::expand_size] == self.layout["image_token_id"]).sum(1).tolist()  # per prompt
            patches = grids.prod(-1).tolist()
            per_token, image, order = sum(patches) // max(sum(tokens), 1), 0, []
            for need in tokens:  # the images of each prompt, in order, repeated
                block = []
                while need > 0:
                    block, need, image = block + [image], need - patches[image] // per_token, image + 1
                order += block * expand_size
            starts = [0, *itertools.accumulate(patches)]
            grids = grids[order]
            pixels = torch.cat([pixels[starts[i] : starts[i + 1]] for i in order])
        if pixels is not None:
            kwargs["pixel_values"] = pixels
        if grids is not None:
            kwargs["image_grid_thw"] = grids
        return input_ids, kwargs

    def _validate_model_kwargs(self, model_kwargs: dict) -> None:
        """The layout's other pixel tensors (`image_inputs`) are this model's inputs too: `forward` takes them by
        `**kwargs`, which transformers' check does not look into."""
        pixels = {k: model_kwargs.pop(k) for k in self.layout.get("image_inputs", []) if k in model_kwargs}
        super()._validate_model_kwargs(model_kwargs)
        model_kwargs.update(pixels)

    def _prepare_cache_for_generation(self, *args, **kwargs):
        return  # the past is the decoder's outputs, built by `forward`

    # transformers 5 asks a model these (PreTrainedModel's answers for code of its own, without experts)
    @classmethod
    def is_remote_code(cls) -> bool:
        return False

    def get_experts_implementation(self) -> dict:
        return {}


class ORTModelForImageTextToTextSteps(ModelSteps, ORTModelForImageTextToText):
    """What `ORTModelForImageTextToText.from_pretrained` returns when `vlm.json` says `"steps": true` (GIT, Idefics,
    Kosmos-2: the forward `generate` steps, as a prompt graph and a decode-step graph)."""


def _pairs(tensors: list[torch.Tensor]) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
    return tuple(tuple(tensors[i : i + 2]) for i in range(0, len(tensors), 2))
