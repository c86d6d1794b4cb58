"""The steps of `ORTModelForImageTextToText` for exports whose graphs are the model's own forward per kind of step
(`exporters/vision_language/steps.py`: GIT, Idefics, Kosmos-2): `prefill_model` on the prompt, `decoder_model` on each new
token (`text_prefill_model`, and `text_decoder_model` where there is one, for prompts without an image). Each
graph is fed the inputs it names: ids, the attention mask, positions from the mask, the past, the processor's
tensors that `generate` passes along, the image graph's output (`prefill_inputs`) and the prompt step's outputs
that decode steps read (`decode_inputs`). A mixin: `image_text_to_text.ORTModelForImageTextToTextSteps` puts it
before the class."""

from __future__ import annotations

import torch
from legacy_bridge import cache_argument
from legacy_bridge import positions as position_rules
from transformers.modeling_outputs import CausalLMOutputWithPast


class ModelSteps:
    """`forward` and what `generate` asks besides, over the two step graphs (the class it mixes into has the
    components, the past's input names and `_split_outputs`)."""

    def forward(self, input_ids: torch.LongTensor, attention_mask: torch.LongTensor | None = None,
                pixel_values: torch.FloatTensor | None = None, past_key_values: tuple | None = None,
                position_ids: torch.LongTensor | None = None, use_cache: bool | None = None,
                **kwargs) -> CausalLMOutputWithPast:
        prefill = past_key_values is None
        if prefill or getattr(self, "_kind", None) is None:  # a prompt without an image: its own graphs, if any
            self._kind = self.layout["text_only"] if pixel_values is None and "text_only" in self.layout else {
                "prefill": "prefill_model", "decoder": "decoder_model",
                "prefill_inputs": self.layout.get("prefill_inputs"), "decode_inputs": self.layout.get("decode_inputs")}
        graph = self.components[self._kind["prefill" if prefill else "decoder"]]
        if attention_mask is None:  # the text's mask: the model's cache may also hold the image
            past = 0 if prefill else self._past_tokens
            attention_mask = torch.ones((input_ids.shape[0], past + input_ids.shape[1]), dtype=torch.long)
        if position_ids is None:  # from the mask, as transformers does for left padding
            past = attention_mask.shape[1] - input_ids.shape[1]
            position_ids = position_rules.positions("mask", input_ids, attention_mask, past)
        given = {**kwargs, "input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids,
                 "pixel_values": pixel_values}
        if prefill:
            given.update(self._prompt_inputs(pixel_values))
        else:
            given.update(zip(self.key_value_input_names, (t for pair in past_key_values for t in pair)))
            given.update(self._decode_inputs(given, input_ids.shape[1]))
        made = (self._kind["prefill_inputs"] or {}) if prefill else {}
        missing = list(dict.fromkeys("pixel_values" if made.get(n) == "image_states" else n
                                     for n in graph.input_names if given.get(n) is None))
        if missing:
            step = "prompt" if prefill else "decode-step"
            raise ValueError(f"this export's {step} graph reads {', '.join(missing)}: pass the processor's (a prompt "
                             "without an image is not supported by this export)")
        for name in graph.input_names:
            self._check_fixed(name, graph.input_shapes[name], given[name])
        out = graph(**{n: given[n] for n in graph.input_names})
        self._past_tokens = attention_mask.shape[1]
        present, others = self._split_outputs(out)
        if prefill:  # the outputs decode steps read back (Idefics' image states)
            self._fed_back = others
        return CausalLMOutputWithPast(logits=out["logits"], **{cache_argument.name(): present})

    def _prompt_inputs(self, pixel_values: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """The prompt step's tensors the image graph makes (Kosmos-2's `image_embeds`, from the pixels)."""
        made = {}
        for name, rule in (self._kind["prefill_inputs"] or {}).items():
            if rule == "image_states" and pixel_values is not None:
                graph = self.components["image_states"]
                self._check_fixed("pixel_values", graph.input_shapes["pixel_values"], pixel_values)
                made[name] = graph(pixel_values=pixel_values)["output"]
        return made

    def _decode_inputs(self, given: dict, new: int) -> dict[str, torch.Tensor]:
        """A decode step's tensors by the layout's rules: the prompt's (as `generate` passes it along), the prompt's
        at the step's last positions, or an output of the prompt's step."""
        made = {}
        for name, rule in (self._kind["decode_inputs"] or {}).items():
            if rule.startswith("output:"):
                made[name] = self._fed_back[rule.removeprefix("output:")]
            elif given.get(name) is not None:
                made[name] = given[name][:, -new:] if rule == "prompt_last" else given[name]
        return made

    def _validate_model_kwargs(self, model_kwargs: dict) -> None:
        """The processor's tensors the graphs take (Idefics' `image_attention_mask`) are this model's inputs too:
        `forward` takes them by `**kwargs`, which transformers' check does not look into."""
        taken = {n for part in self.components.values() for n in part.input_names}
        own = {k: model_kwargs.pop(k) for k in list(model_kwargs) if k in taken}
        super()._validate_model_kwargs(model_kwargs)
        model_kwargs.update(own)

    def _reorder_cache(self, past_key_values: tuple, beam_idx: torch.LongTensor) -> tuple:
        """Beams reorder the past and the prompt step's outputs that decode steps read."""
        self._fed_back = {k: v.index_select(0, beam_idx.to(v.device)) for k, v in self._fed_back.items()}
        return super()._reorder_cache(past_key_values, beam_idx)

    @staticmethod
    def _check_fixed(name: str, dims: list, value: torch.Tensor) -> None:
        """`value` has the graph's fixed axes (an image size fixed at export), else one line: never resized here."""
        if len(dims) != value.dim() or any(isinstance(d, int) and d != n for d, n in zip(dims, value.shape)):
            hint = "; resize the images with the model's processor" if "pixel" in name else ""
            raise ValueError(f"{name} of shape {tuple(value.shape)}: the exported graph takes ({', '.join(map(str, dims))}), "
                             f"its numbers fixed at export{hint}")


__all__ = ["ModelSteps"]
