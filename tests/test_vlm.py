"""Vision-language models (tiny Gemma3 and LLaVA, random weights): the vision encoder, projector, token
embedding and text decoder observed in one real `generate` with an image, each exported and checked
by onnxruntime on its recorded calls; the onnxruntime loop over them gives PyTorch's greedy tokens."""

import json

import numpy as np
import pytest
import torch
from transformers import AutoModelForImageTextToText, AutoProcessor

from optimum_dynamo import export_vlm
from optimum_dynamo.errors import ExportError
from optimum_dynamo.exporters.vlm import default_image, processor_inputs
from optimum_dynamo.runtime.vlm import VlmRunner
from tiny import save_tiny_vlm

ATOL = 1e-4
NEW_TOKENS = 8
PAST = [f"past_key_values.{i}.{kv}" for i in range(2) for kv in ("key", "value")]
# model type -> (vision output fed to the projector, leading positions dropped, decoder takes token types)
EXPECTED = {"gemma3": ("last_hidden_state", 0, True), "llava": ("hidden_states.1", 1, False)}


@pytest.fixture(scope="module", params=sorted(EXPECTED))
def exported(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    path = save_tiny_vlm(request.param, root / "model")
    result = export_vlm(path, root / "onnx", atol=ATOL)
    model = AutoModelForImageTextToText.from_pretrained(path).eval()
    return request.param, model, AutoProcessor.from_pretrained(path), result


def _prompt(processor, words="the quick {} brown fox"):
    return words.format(getattr(processor, "boi_token", None) or processor.image_token)


def test_each_component_matches_pytorch_on_its_captured_calls(exported):
    model_type, _, _, result = exported
    calls = {name: len(ctx.observer.calls) for name, ctx in result.components.items()}
    assert calls == {"vision_encoder": 1, "multi_modal_projector": 1, "embed_tokens": 4, "decoder_model": 4}
    for name, ctx in result.components.items():
        assert ctx.discrepancies, name
        assert {row.output for row in ctx.discrepancies} == set(ctx.output_names), name
        assert all(row.calls == calls[name] for row in ctx.discrepancies), name
        worst = max(ctx.discrepancies, key=lambda row: row.max_abs)
        assert worst.max_abs < ATOL, f"{model_type} {name}: {worst}"


def test_layout_names_and_files(exported):
    model_type, model, processor, result = exported
    source, skip, token_types = EXPECTED[model_type]
    layout = json.loads((result.output / "vlm.json").read_text())
    assert layout == result.layout
    assert (layout["vision_output"], layout["vision_skip"], layout["token_type_ids"]) == (source, skip, token_types)
    assert layout["image_token_id"] == 4
    decoder = result.components["decoder_model"]
    assert decoder.arguments.input_names == ["inputs_embeds", "attention_mask", "position_ids", *PAST] + (
        ["token_type_ids"] if token_types else []
    )
    assert decoder.output_names == ["logits", *[n.replace("past_key_values", "present") for n in PAST]]
    assert decoder.arguments.axis_names["token_type_ids" if token_types else "attention_mask"][1] == (
        "past_sequence_length + sequence_length"
    )
    assert result.components["vision_encoder"].arguments.input_names == ["pixel_values"]
    for name in layout["components"]:
        assert (result.output / name / "model.onnx").is_file()
    saved = AutoProcessor.from_pretrained(result.output)  # the processor and config travel with the graphs
    assert type(saved) is type(processor) and saved.image_token == processor.image_token
    assert type(model.config).from_pretrained(result.output).image_token_index == 4


@pytest.mark.parametrize("seed, words", [(1, "the quick {} brown fox"), (2, "hello world {} from the lazy dog")])
def test_onnxruntime_loop_gives_pytorch_greedy_tokens(exported, seed, words):
    _, model, processor, result = exported
    inputs = processor_inputs(model, processor, default_image(seed=seed), _prompt(processor, words))
    with torch.no_grad():
        expected = model.generate(**inputs, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
        first = model(**inputs).logits[0, -1]
    tokens, logits = VlmRunner(result.output).generate(
        inputs["input_ids"].numpy(), inputs["pixel_values"].numpy(), max_new_tokens=NEW_TOKENS, return_logits=True
    )
    assert tokens.tolist() == expected[:, inputs["input_ids"].shape[1] :].tolist()
    assert np.abs(logits[0] - first.numpy()).max() < ATOL


def test_the_image_changes_the_first_logits(exported):
    _, model, processor, result = exported
    runner = VlmRunner(result.output)
    firsts = []
    for seed in (3, 4):
        inputs = processor_inputs(model, processor, default_image(seed=seed), _prompt(processor))
        firsts.append(runner.generate(inputs["input_ids"].numpy(), inputs["pixel_values"].numpy(),
                                      max_new_tokens=1, return_logits=True)[1][0])
    assert np.abs(firsts[0] - firsts[1]).max() > 1e-3


def test_gemma3_image_tokens_attend_to_each_other(exported):
    """Without token types (a causal mask over the image) the prompt's presents differ from PyTorch's."""
    model_type, model, processor, result = exported
    if model_type != "gemma3":
        pytest.skip("only Gemma3 attends bidirectionally within an image")
    runner = VlmRunner(result.output)
    inputs = processor_inputs(model, processor, default_image(seed=5), _prompt(processor))
    ids = inputs["input_ids"].numpy()
    embeds = runner.prompt_embeddings(ids, inputs["pixel_values"].numpy())
    feed = {"inputs_embeds": embeds, "attention_mask": np.ones_like(ids), "position_ids": np.arange(ids.shape[1])[None],
            **runner.empty_past(1)}
    with torch.no_grad():
        expected = model(**inputs, use_cache=True).past_key_values
    expected_key = torch.stack([expected.layers[1].keys] if hasattr(expected, "layers") else [expected.key_cache[1]])[0]
    differences = []
    for types in ((ids == 4).astype(np.int64), np.zeros_like(ids)):
        out = runner._run("decoder_model", dict(feed, token_type_ids=types))
        differences.append(np.abs(out["present.1.key"] - expected_key.numpy()).max())
    assert differences[0] < ATOL and differences[1] > 1e-3


def test_runner_refuses_a_batch_of_two(exported):
    _, model, processor, result = exported
    inputs = processor_inputs(model, processor, default_image(), _prompt(processor))
    ids = inputs["input_ids"].numpy().repeat(2, axis=0)
    with pytest.raises(ValueError, match="the runner supports batch 1, got a batch of 2"):
        VlmRunner(result.output).generate(ids, inputs["pixel_values"].numpy().repeat(2, axis=0))


def test_prompt_without_image_placeholder_is_refused(tmp_path):
    path = save_tiny_vlm("llava", tmp_path / "model")
    with pytest.raises(ExportError, match="the prompt has no image token: put the processor's image placeholder in it, e.g. 'the quick <image> brown fox'"):
        export_vlm(path, tmp_path / "onnx", prompt="the quick brown fox")
    assert not (tmp_path / "onnx" / "vlm.json").exists()


def test_atol_below_the_measured_difference_names_the_component_and_leaves_nothing(tmp_path):
    path = save_tiny_vlm("llava", tmp_path / "model")
    with pytest.raises(ExportError, match=r"^vision_encoder: output '[\w.]+' differs from PyTorch by .* > atol 1e-12"):
        export_vlm(path, tmp_path / "out" / "onnx", atol=1e-12)
    assert not (tmp_path / "out").exists()


def test_gemma3_generates_past_its_sliding_window(tmp_path):
    """Observed across the window (10-token prompt, window 12, 6 new tokens), the sliding past is a
    bounded axis of its own, and 14 runner tokens (24 positions) equal PyTorch's."""
    path = save_tiny_vlm("gemma3", tmp_path / "model", sliding_window=12)
    result = export_vlm(path, tmp_path / "onnx", max_new_tokens=6, atol=ATOL)
    axes = result.components["decoder_model"].arguments.axis_names
    assert axes["past_key_values.0.key"][2] == "sliding_past_sequence_length"
    assert axes["past_key_values.1.key"][2] == "past_sequence_length"
    model = AutoModelForImageTextToText.from_pretrained(path).eval()
    processor = AutoProcessor.from_pretrained(path)
    inputs = processor_inputs(model, processor, default_image(seed=1), _prompt(processor))
    assert inputs["input_ids"].shape[1] == 10
    with torch.no_grad():
        expected = model.generate(**inputs, max_new_tokens=14, min_new_tokens=14, do_sample=False)
    tokens = VlmRunner(result.output).generate(inputs["input_ids"].numpy(), inputs["pixel_values"].numpy(), max_new_tokens=14)
    assert tokens.tolist() == expected[:, 10:].tolist()
