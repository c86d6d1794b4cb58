"""Greedy generation with onnxruntime over the components written by `export_vlm`.

    runner = VlmRunner("out")
    inputs = processor(images=image, text=prompt, return_tensors="np")
    new_tokens = runner.generate(inputs["input_ids"], inputs["pixel_values"], max_new_tokens=8)

One step at a time, as PyTorch's `generate` does:

1. `image_features` on the pixels (the model's `get_image_features`): one row per image token
   (directories of the older layout: `vision_encoder`, then `multi_modal_projector`);
2. `embed_tokens` on the prompt; the rows at the image token positions are replaced by the features;
3. `decoder_model` on the embeddings with an empty past (length 0), then on the embedding of each
   new token with the presents of the step before as past; the next token is the argmax of the logits.

Supported: batch 1, prompts without padding, greedy search (`ORTModelForImageTextToText` runs
transformers' `generate` over the same graphs: batches, sampling, beams). Gemma3's `token_type_ids` (1 at image
tokens) are passed over the whole sequence, so the tokens of an image attend to each other.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime


class VlmRunner:
    def __init__(self, directory: str | Path, providers: list[str] | None = None):
        directory = Path(directory)
        self.layout = json.loads((directory / "vlm.json").read_text())
        providers = providers or ["CPUExecutionProvider"]
        self.sessions = {
            name: onnxruntime.InferenceSession(str(directory / path), providers=providers)
            for name, path in self.layout["components"].items()
        }

    def _run(self, component: str, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        session = self.sessions[component]
        names = [o.name for o in session.get_outputs()]
        return dict(zip(names, session.run(None, {i.name: feed[i.name] for i in session.get_inputs()})))

    def _single_input(self, component: str) -> str:
        (first,) = self.sessions[component].get_inputs()
        return first.name

    def image_features(self, pixel_values: np.ndarray) -> np.ndarray:
        """(image tokens, hidden): the rows that replace the image tokens."""
        if "image_features" in self.sessions:
            return self._run("image_features", {"pixel_values": pixel_values.astype(np.float32)})["output"]
        vision = self._run("vision_encoder", {"pixel_values": pixel_values.astype(np.float32)})
        selected = vision[self.layout["vision_output"]][:, self.layout["vision_skip"] :]
        return self._run("multi_modal_projector", {self._single_input("multi_modal_projector"): selected})["output"]

    def embed(self, input_ids: np.ndarray) -> np.ndarray:
        ids = np.where(input_ids >= self.layout["vocab_size"], 0, input_ids)  # out-of-vocabulary image tokens
        return self._run("embed_tokens", {self._single_input("embed_tokens"): ids.astype(np.int64)})["output"]

    def prompt_embeddings(self, input_ids: np.ndarray, pixel_values: np.ndarray | None) -> np.ndarray:
        embeds = self.embed(input_ids)
        is_image = input_ids == self.layout["image_token_id"]
        if pixel_values is not None and is_image.any():
            features = self.image_features(pixel_values)
            rows = features.reshape(-1, features.shape[-1])
            if rows.shape[0] != is_image.sum():
                raise ValueError(f"{is_image.sum()} image tokens in the prompt but {rows.shape[0]} image features")
            embeds[is_image] = rows
        return embeds

    def empty_past(self, batch: int) -> dict[str, np.ndarray]:
        """Zero-length past for the first step; the other axes are the graph's fixed sizes."""
        past = {}
        for value in self.sessions["decoder_model"].get_inputs():
            if value.name.startswith("past_key_values."):
                shape = [batch if axis == 0 else 0 if isinstance(dim, str) else dim for axis, dim in enumerate(value.shape)]
                past[value.name] = np.zeros(shape, dtype=np.float32)
        return past

    def generate(
        self,
        input_ids: np.ndarray,
        pixel_values: np.ndarray | None = None,
        *,
        max_new_tokens: int = 8,
        eos_token_id: int | None = None,
        return_logits: bool = False,
    ):
        """The greedy new tokens, shape (1, <= max_new_tokens); with `return_logits`, also the logits
        each step chose from, shape (steps, vocabulary)."""
        input_ids = np.asarray(input_ids, dtype=np.int64)
        if input_ids.shape[0] != 1:
            raise ValueError(f"the runner supports batch 1, got a batch of {input_ids.shape[0]}")
        embeds = self.prompt_embeddings(input_ids, pixel_values)
        token_types = (input_ids == self.layout["image_token_id"]).astype(np.int64)
        past, total, new_tokens, scores = self.empty_past(1), 0, [], []
        for _ in range(max_new_tokens):
            length = embeds.shape[1]
            feed = {
                "inputs_embeds": embeds,
                "attention_mask": np.ones((1, total + length), dtype=np.int64),
                "position_ids": np.arange(total, total + length, dtype=np.int64)[None] + self.layout.get("position_offset", 0),
                **past,
            }
            total += length
            if self.layout["token_type_ids"]:
                feed["token_type_ids"] = np.pad(token_types, ((0, 0), (0, total - token_types.shape[1])))
            out = self._run("decoder_model", feed)
            scores.append(out["logits"][0, -1])
            token = int(scores[-1].argmax())
            new_tokens.append(token)
            if token == eos_token_id:
                break
            past = {name.replace("present.", "past_key_values.", 1): v for name, v in out.items() if name.startswith("present.")}
            embeds = self.embed(np.array([[token]], dtype=np.int64))
        tokens = np.array([new_tokens], dtype=np.int64)
        return (tokens, np.stack(scores)) if return_logits else tokens
