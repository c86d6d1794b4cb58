"""Vision-language models whose images do not replace image-token rows of the prompt's embeddings (GIT: the
image's features a prefix of the text; Idefics: cross-attention to the image's states; Kosmos-2: its `generate`
encodes the image, then steps its text model): the forward that `generate` steps, as it calls it, exported as
graphs per kind of step.

- `prefill_model`: the prompt's step (the processor's tensors, no past) -> the logits of the last position, the
  cache the model made, and the outputs decode steps read back;
- `decoder_model`: one new token with the past, plus what `generate` passes again;
- `image_states` (Kosmos-2): what the model's `generate` computes from the pixels before its text model's;
- `text_prefill_model` (and `text_decoder_model` where its decode steps take other tensors, GIT on transformers 4):
  the same for prompts without an image, where the model's `generate` takes them.

The graphs sit in `steps/` and read the weights they hold in common from one file there, `weights.onnx_data`
(`shared_weights`). `vlm.json` says `"steps": true` and how the runtime (`ORTModelForImageTextToText`) makes each
step's tensors besides ids, mask, positions and past (`prefill_inputs`, `decode_inputs`). Anything else `generate`
passes is refused at export, in one line.
"""

from __future__ import annotations

import inspect

import torch
from legacy_bridge import cache_argument
from legacy_bridge import positions as position_rules

from ...capture import Call, InputObserver, observe
from ...capture.drivers import Generation, greedy
from ...errors import ExportError
from .image_features import default_image
from .prompts import image_token, processor_inputs, text_batches

STEP_INPUTS = ("input_ids", "attention_mask", "position_ids", "past_key_values")  # what the runtime makes per step
MADE_INSIDE = ("cache_position",)  # rebuilt by `ModelStep` from the past's length
STEPS_DIR = "steps"  # the graphs' directory; their weights in one file there (`shared_weights`)


class ModelStep(torch.nn.Module):
    """`model` on one generation step, its tensors by name: the logits of the last position and the cache (the
    model makes an empty one at the prefill)."""

    def __init__(self, model: torch.nn.Module, returned: list[str] = ()):
        super().__init__()
        self.model, self.returned = model, list(returned)  # `returned`: outputs decode steps read back
        params = inspect.signature(model.forward).parameters
        self.keep = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
        self.takes_cache_position = "cache_position" in params

    def forward(self, **tensors):
        past, new = tensors.pop("past_key_values", None), tensors["input_ids"].shape[1]
        extra = dict(self.keep)
        if past is not None:
            extra[cache_argument.name()] = past
        if self.takes_cache_position:
            start = past.get_seq_length() if past is not None else 0
            extra["cache_position"] = torch.arange(start, start + new, device=tensors["input_ids"].device)
        out = self.model(**tensors, use_cache=True, return_dict=True, **extra)
        return {"logits": out.logits[:, -1:], "past_key_values": cache_argument.of(out),
                **{k: out[k] for k in self.returned}}

    @classmethod
    def taking(cls, model: torch.nn.Module, names: list[str], returned: list[str] = ()) -> "ModelStep":
        """A step whose forward declares `names` (torch.export matches inputs and shapes to the signature)."""
        keyword = inspect.Parameter.POSITIONAL_OR_KEYWORD
        signature = inspect.Signature([inspect.Parameter(n, keyword) for n in ["self", *names]])

        def forward(self, **tensors):
            return cls.forward(self, **tensors)

        forward.__signature__ = signature
        return type(cls.__name__, (cls,), {"forward": forward})(model, returned)


def step_batches(model, processor, image=None, prompt: str | None = None) -> list[dict]:
    """A prompt with its image, then two prompts of other lengths (left-padded) with an image each: the prefill
    graph sees its batch and sequence axes vary."""
    if prompt is None:  # the image placeholder, where the processor has one
        token = image_token(processor)
        prompt = f"the quick {token} brown fox" if token else "the quick brown fox"
    tokenizer = getattr(processor, "tokenizer", processor)
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    try:
        first = image or default_image(seed=1)
        return [processor_inputs(model, processor, [first], [prompt]),
                processor_inputs(model, processor, [first, default_image(seed=2)],
                                 [prompt, f"a longer prompt: {prompt} jumps over the lazy dog"], padding=True)]
    finally:
        tokenizer.padding_side = side


def _is_prefill(call: Call) -> bool:
    past = cache_argument.of(call.kwargs)
    return past is None or past.get_seq_length() == 0


def step_rule(name: str, value: torch.Tensor, batch: dict, new: int, carried: dict) -> str:
    """How the runtime makes a step's tensor `name`: "prompt" (the processor's, as it is), "prompt_last" (the
    processor's at the step's last `new` positions: Idefics' image attention mask) or "output:<name>" (an output
    of the prompt's step, fed back: Idefics' image states); else one line."""
    given = batch.get(name)
    if given is not None and torch.equal(value, given):
        return "prompt"
    if given is not None and given.dim() > 1 and torch.equal(value, given[:, -new:]):
        return "prompt_last"
    for key, out in carried.items():
        if isinstance(out, torch.Tensor) and out.shape == value.shape and torch.equal(out, value):
            return f"output:{key}"
    raise ExportError(f"generate passes {name} to the model, which is neither one of the processor's tensors nor an "
                      "output of the prompt's step: this model's export is not supported")


def _check_positions(call: Call) -> None:
    given, ids, mask = call.kwargs.get("position_ids"), call.kwargs["input_ids"], call.kwargs["attention_mask"]
    real = mask[:, -ids.shape[1]:] == 1  # padding's positions differ by version; nothing reads them
    expected = position_rules.positions("mask", ids, mask, mask.shape[1] - ids.shape[1])
    if given is not None and not torch.equal(given[real], expected[real]):
        raise ExportError("generate passes position_ids that do not follow the attention mask: this model's export "
                          "is not supported")


class ImageStates(torch.nn.Module):
    """The model's own `generate` on the pixels, up to the call of its text model's `generate`: the tensor it passes
    there as `name` (Kosmos-2's `image_embeds`, computed from the pixels by the vision tower and the projection)."""

    def __init__(self, model: torch.nn.Module, stepper: torch.nn.Module, name: str):
        super().__init__()
        self.model, self.stepper, self.name = model, stepper, name

    def forward(self, pixel_values):
        def given(**kwargs):  # the text model's generate, not run: what it was given
            return kwargs[self.name]

        self.stepper.generate = given
        try:
            return self.model.generate(pixel_values=pixel_values)
        finally:
            del self.stepper.generate


def stepped_generate(model, batch: dict, max_new_tokens: int):
    """Greedy `generate` on `batch`, observed: (the module it stepped, its calls, the new tokens). The module is the
    model, or the child whose own `generate` the model's called (Kosmos-2's text model)."""
    from transformers.generation import GenerationMixin

    children = {n: m for n, m in model.named_children() if isinstance(m, GenerationMixin)}
    with observe(model, **{f"child:{n}": m for n, m in children.items()}) as obs, torch.no_grad():
        out = model.generate(**batch, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, do_sample=False)
    observers = obs if isinstance(obs, dict) else {"model": obs}  # the model first
    called = [name for name, observer in observers.items() if observer.calls]
    if not called or not _is_prefill(observers[called[0]].calls[0]):
        raise ExportError(f"generate never called {type(model).__name__}.forward, or one text model's, on the prompt "
                          "(it runs other modules): this model's export is not supported")
    stepper = observers[called[0]]
    return stepper.module, stepper.calls, out[:, batch["input_ids"].shape[1]:]


def prompt_rules(model, stepper, call: Call, batch: dict, image_calls: list[Call]) -> dict[str, str]:
    """How the runtime makes the prompt step's tensors besides ids, mask and positions: the processor's, or
    "image_states" (the image graph's output on the processor's pixels: `ImageStates`, what the model's `generate`
    computes before its text model's). The step takes the processor's ids and mask as they are (BLIP's `generate`
    rewrites the prompt: refused)."""
    for name in ("input_ids", "attention_mask"):
        if name in batch and not torch.equal(call.kwargs[name], batch[name]):
            raise ExportError(f"generate gives the model a prompt other than the processor's {name} (it rewrites the "
                              "prompt): this model's export is not supported")
    rules = {}
    for name, value in call.kwargs.items():
        if not isinstance(value, torch.Tensor) or name in STEP_INPUTS + MADE_INSIDE:
            continue
        if name in batch and torch.equal(value, batch[name]):
            continue
        if stepper is not model and "pixel_values" in batch:
            with torch.no_grad():
                states = ImageStates(model, stepper, name)(batch["pixel_values"])
            if isinstance(states, torch.Tensor) and states.shape == value.shape and torch.equal(states, value):
                image_calls.append(Call({"pixel_values": batch["pixel_values"]}, states))
                rules[name] = "image_states"
                continue
        raise ExportError(f"generate passes {name} to the model on the prompt, which is neither one of the processor's "
                          "tensors nor the model's image features: this model's export is not supported")
    return rules


def _observe_kind(model, batches: list[dict], max_new_tokens: int, image_calls: list[Call]) -> dict:
    """Greedy `generate` on `batches` (prompts of one kind: with an image each, or without) under observation: the
    stepped module, the prompt's and the decode steps' calls, the tensors' rules (`prompt_rules`, `step_rule`), the
    outputs decode steps read back and the first batch's new tokens."""
    prefill, decode, tokens, rules, first_rules, stepper = [], [], None, {}, None, None
    for batch in batches:
        module, calls, new = stepped_generate(model, batch, max_new_tokens)
        if stepper not in (None, module):
            raise ExportError("generate steps different modules from prompt to prompt: this model's export is not supported")
        stepper, tokens = module, new if tokens is None else tokens
        prompt_mask = batch.get("attention_mask", torch.ones_like(batch["input_ids"]))
        carried = {k: v for k, v in calls[0].outputs.items() if k not in ("logits", *cache_argument.NAMES)}
        for step, call in enumerate(calls):
            first = step == 0
            if call.kwargs.get("attention_mask") is None:  # transformers 5 drops an all-ones mask: the graphs take one
                grown = torch.ones(prompt_mask.shape[0], step, dtype=prompt_mask.dtype)  # (the cache may hold more)
                call.kwargs["attention_mask"] = torch.cat([prompt_mask, grown], dim=1)
            kwargs = {k: v for k, v in call.kwargs.items() if isinstance(v, torch.Tensor) and k not in MADE_INSIDE}
            if first:
                found = prompt_rules(model, stepper, call, batch, image_calls)
                if first_rules not in (None, found):
                    raise ExportError("generate passes different tensors on the prompts' steps: this model's export "
                                      "is not supported")
                first_rules = found
            _check_positions(call)
            for name, value in kwargs.items():
                if first or name in STEP_INPUTS:
                    continue
                rule = step_rule(name, value, batch, call.kwargs["input_ids"].shape[1], carried)
                if rules.setdefault(name, rule) != rule:
                    raise ExportError(f"generate passes {name} to the model differently from step to step: this "
                                      "model's export is not supported")
            outputs = {"logits": call.outputs.logits[:, -1:], "past_key_values": cache_argument.of(call.outputs)}
            if first:
                outputs.update(carried)
            else:
                kwargs["past_key_values"] = cache_argument.of(call.kwargs)
            (prefill if first else decode).append(Call(kwargs, outputs))
    fed_back = sorted({rule.removeprefix("output:") for rule in rules.values() if rule.startswith("output:")})
    for call in prefill:  # the prompt's step returns only the outputs decode steps read
        call.outputs = {k: v for k, v in call.outputs.items() if k in ("logits", "past_key_values", *fed_back)}
    return {"stepper": stepper, "prefill": prefill, "decode": decode, "prefill_inputs": first_rules,
            "decode_inputs": rules, "fed_back": fed_back, "tokens": tokens, "batch": batches[0]}


def _names(calls: list[Call], graph: str) -> list[str]:
    names = list(dict.fromkeys(k for c in calls for k in c.kwargs))
    if any(set(c.kwargs) != set(names) for c in calls):
        raise ExportError(f"generate passes different tensors on its {graph.split('_')[-2]} steps: this model's "
                          "export is not supported")
    return names


def observe_steps(model, processor, image=None, prompt: str | None = None, max_new_tokens: int = 4):
    """Greedy `generate` on `step_batches`, then on `text_batches`, under observation: (plan, layout, the first
    batch's `Generation`), as `observe_vlm` returns them. The layout's `prefill_inputs` and `decode_inputs` say how the
    runtime makes each step's tensors besides ids, mask, positions and past (`prompt_rules`, `step_rule`);
    `text_only`, the graphs and rules of prompts without an image (their own prompt graph; the decode-step graph of
    prompts with one where it takes the same tensors by the same rules, else their own)."""
    image_calls = []
    seen = _observe_kind(model, step_batches(model, processor, image, prompt), max_new_tokens, image_calls)
    stepper, text = seen["stepper"], None
    if batches := text_batches(model, processor):
        text = _observe_kind(model, batches, max_new_tokens, [])
        if text["stepper"] is not stepper:
            raise ExportError("generate steps another module on a prompt without an image: this model's export is "
                              "not supported")
    plan = {}
    if image_calls:
        states = [name for name, rule in seen["prefill_inputs"].items() if rule == "image_states"]
        if len(states) != 1:
            raise ExportError(f"generate computes {states} from the pixels before its text model's: this model's "
                              "export is not supported")
        module = ImageStates(model, stepper, states[0])
        plan["image_states"] = (InputObserver(module, "image_states", calls=image_calls), ["pixel_values"], {})
    graphs = {"prefill_model": (seen["prefill"], seen["fed_back"]), "decoder_model": (seen["decode"], [])}
    layout = {"model_type": model.config.model_type, "steps": True, "prefill_inputs": seen["prefill_inputs"],
              "decode_inputs": seen["decode_inputs"]}
    if text is not None:
        graphs["text_prefill_model"] = (text["prefill"], text["fed_back"])
        decoder = "decoder_model"
        if (set(_names(text["decode"], "text_decoder_model")) != set(_names(seen["decode"], decoder))
                or text["decode_inputs"] != seen["decode_inputs"]):
            decoder = "text_decoder_model"
            graphs[decoder] = (text["decode"], [])
        else:  # one decode-step graph, validated on both kinds of prompt
            graphs[decoder][0].extend(text["decode"])
        layout["text_only"] = {"prefill": "text_prefill_model", "decoder": decoder,
                               "prefill_inputs": text["prefill_inputs"], "decode_inputs": text["decode_inputs"]}
    for name, (calls, returned) in graphs.items():
        names = _names(calls, name)
        plan[name] = (InputObserver(ModelStep.taking(stepper, names, returned), name, calls=calls), names, {})
    layout["components"] = {name: f"{STEPS_DIR}/{name}.onnx" for name in plan}  # one directory: the weights shared
    layout["weights"] = f"{STEPS_DIR}/weights.onnx_data"
    return plan, layout, Generation(seen["batch"], greedy(max_new_tokens), seen["tokens"])


__all__ = ["ImageStates", "ModelStep", "observe_steps", "prompt_rules", "step_batches", "step_rule", "stepped_generate"]
