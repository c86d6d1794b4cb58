"""Vision-language models (tiny Gemma3 and LLaVA, random weights): the vision encoder, projector, token
embedding and text decoder observed in one real `generate` with an image, each exported and checked
by onnxruntime on its recorded calls; the graphs, joined by `ORTModelForImageTextToText`, give PyTorch's
first logits (within 1e-4) and greedy tokens."""

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForImageTextToText, AutoProcessor

from optimum_dynamo import ORTModelForImageTextToText, export_vlm
from optimum_dynamo.errors import ExportError
from optimum_dynamo.exporters.vision_language import default_image, processor_inputs
from optimum_dynamo.manifest import read_manifest
from tiny import save_tiny_vlm, tiny_vlm_processor

ATOL = 1e-4
NEW_TOKENS = 8
GREEDY = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
PAST = [f"past_key_values.{i}.{kv}" for i in range(2) for kv in ("key", "value")]
# model type -> (vision output fed to the projector, leading positions dropped, decoder takes token types)
EXPECTED = {"gemma3": ("last_hidden_state", 0, True), "llava": ("hidden_states.1", 1, False)}


@pytest.fixture(scope="module", params=sorted(EXPECTED))
def exported(request, vlm_models):
    """(model type, PyTorch model, processor, the export's directory), exported by `from_pretrained(export=True, dynamo=True)`."""
    path, ort = vlm_models(request.param)
    model = AutoModelForImageTextToText.from_pretrained(path).eval()
    return request.param, model, AutoProcessor.from_pretrained(path), Path(ort.model_save_dir)


def _prompt(processor, words="the quick {} brown fox"):
    return words.format(getattr(processor, "boi_token", None) or processor.image_token)


def test_each_component_matches_pytorch_on_its_captured_calls(exported):
    model_type, _, _, directory = exported
    records = read_manifest(directory)["components"]
    calls = {name: record["calls_recorded"] for name, record in records.items()}
    assert calls == {"vision_encoder": 1, "multi_modal_projector": 1, "embed_tokens": 4, "decoder_model": 4}
    for name, record in records.items():
        assert {row["output"] for row in record["discrepancies"]} == set(record["outputs"]), name
        assert all(row["calls"] == calls[name] for row in record["discrepancies"]), name
        worst = max(record["discrepancies"], key=lambda row: row["max_abs"])
        assert worst["max_abs"] < ATOL, f"{model_type} {name}: {worst}"


def test_layout_names_and_files(exported):
    model_type, model, processor, directory = exported
    source, skip, token_types = EXPECTED[model_type]
    layout = json.loads((directory / "vlm.json").read_text())
    assert (layout["vision_output"], layout["vision_skip"], layout["token_type_ids"]) == (source, skip, token_types)
    assert layout["image_token_id"] == 4
    records = read_manifest(directory)["components"]
    decoder = records["decoder_model"]
    assert decoder["inputs"] == ["inputs_embeds", "attention_mask", "position_ids", *PAST] + (
        ["token_type_ids"] if token_types else []
    )
    assert decoder["outputs"] == ["logits", *[n.replace("past_key_values", "present") for n in PAST]]
    assert decoder["dynamic_axes"]["token_type_ids" if token_types else "attention_mask"]["1"] == (
        "past_sequence_length + sequence_length"
    )
    assert records["vision_encoder"]["inputs"] == ["pixel_values"]
    for name in layout["components"]:
        assert (directory / name / "model.onnx").is_file()
    saved = AutoProcessor.from_pretrained(directory)  # the processor and config travel with the graphs
    assert type(saved) is type(processor) and saved.image_token == processor.image_token
    assert type(model.config).from_pretrained(directory).image_token_index == 4


@pytest.mark.parametrize("seed, words", [(1, "the quick {} brown fox"), (2, "hello world {} from the lazy dog")])
def test_graphs_give_pytorch_s_first_logits_and_greedy_tokens(exported, seed, words):
    _, model, processor, directory = exported
    inputs = processor_inputs(model, processor, default_image(seed=seed), _prompt(processor, words))
    ort = ORTModelForImageTextToText.from_pretrained(directory)
    with torch.no_grad():
        expected = model.generate(**inputs, **GREEDY)
        assert (ort(**inputs).logits[0, -1] - model(**inputs).logits[0, -1]).abs().max() < ATOL
        assert ort.generate(**inputs, **GREEDY).tolist() == expected.tolist()


def test_the_image_changes_the_first_logits(exported):
    _, model, processor, directory = exported
    ort = ORTModelForImageTextToText.from_pretrained(directory)
    with torch.no_grad():
        firsts = [ort(**processor_inputs(model, processor, default_image(seed=seed), _prompt(processor))).logits[0, -1]
                  for seed in (3, 4)]
    assert (firsts[0] - firsts[1]).abs().max() > 1e-3


def test_gemma3_image_tokens_attend_to_each_other(exported):
    """Without token types (a causal mask over the image) the prompt's presents differ from PyTorch's."""
    model_type, model, processor, directory = exported
    if model_type != "gemma3":
        pytest.skip("only Gemma3 attends bidirectionally within an image")
    ort = ORTModelForImageTextToText.from_pretrained(directory)
    inputs = processor_inputs(model, processor, default_image(seed=5), _prompt(processor))
    ids = inputs["input_ids"]
    feed = {"inputs_embeds": ort.prompt_embeddings(ids, inputs["pixel_values"]), "attention_mask": torch.ones_like(ids),
            "position_ids": torch.arange(ids.shape[1])[None],
            **dict(zip(ort.key_value_input_names, [t for pair in ort.empty_past(1) for t in pair]))}
    with torch.no_grad():
        expected = model(**inputs, use_cache=True).past_key_values
    expected_key = expected.layers[1].keys if hasattr(expected, "layers") else expected.key_cache[1]
    differences = []
    for types in ((ids == 4).long(), torch.zeros_like(ids)):
        out = ort.decoder(**feed, token_type_ids=types)
        differences.append((out["present.1.key"] - expected_key).abs().max())
    assert differences[0] < ATOL and differences[1] > 1e-3


def test_prompt_without_image_placeholder_is_refused(tmp_path):
    path = save_tiny_vlm("llava", tmp_path / "model")
    with pytest.raises(ExportError, match="the prompt has no image token: put the processor's image placeholder in it, e.g. 'the quick <image> brown fox'"):
        export_vlm(path, tmp_path / "onnx", prompt="the quick brown fox")
    assert not (tmp_path / "onnx" / "vlm.json").exists()


@pytest.mark.once("t4")
def test_atol_below_the_measured_difference_names_the_component_and_leaves_nothing(tmp_path):
    path = save_tiny_vlm("llava", tmp_path / "model")
    with pytest.raises(ExportError, match=r"^vision_encoder: output '[\w.]+' differs from PyTorch by .* > atol 1e-12"):
        export_vlm(path, tmp_path / "out" / "onnx", atol=1e-12)
    assert not (tmp_path / "out").exists()


@pytest.mark.once("t5")
def test_gemma3_generates_past_its_sliding_window(tmp_path):
    """Observed across the window (10-token prompt, window 12, 6 new tokens), the sliding past is a
    bounded axis of its own, and 14 greedy tokens (24 positions) equal PyTorch's."""
    path = save_tiny_vlm("gemma3", tmp_path / "model", sliding_window=12)
    result = export_vlm(path, tmp_path / "onnx", max_new_tokens=6, atol=ATOL)
    axes = result.components["decoder_model"].arguments.axis_names
    assert axes["past_key_values.0.key"][2] == "sliding_past_sequence_length"
    assert axes["past_key_values.1.key"][2] == "past_sequence_length"
    model = AutoModelForImageTextToText.from_pretrained(path).eval()
    processor = AutoProcessor.from_pretrained(path)
    inputs = processor_inputs(model, processor, default_image(seed=1), _prompt(processor))
    assert inputs["input_ids"].shape[1] == 10
    options = dict(max_new_tokens=14, min_new_tokens=14, do_sample=False)
    with torch.no_grad():
        expected = model.generate(**inputs, **options)
        tokens = ORTModelForImageTextToText.from_pretrained(result.output).generate(**inputs, **options)
    assert tokens.tolist() == expected.tolist()


def test_the_removed_runner_names_its_replacement():
    import optimum_dynamo

    with pytest.raises(AttributeError, match=r"^optimum_dynamo\.VlmRunner was removed: use ORTModelForImageTextToText "):
        optimum_dynamo.VlmRunner


@pytest.mark.parametrize("model_type", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_transformers_4_towers_run_on_grid_inputs_made_outside(tmp_path, model_type):
    """4.57's Qwen-VL towers derive their attention bounds, rotary positions, windows (2.5) and interpolated position
    table (3) from the grid inside forward; the export makes them from the grid (grid_tower_v4) and runs the tower's
    modules on them: the tower's own output for two images of different sizes, to 1e-6."""
    import transformers

    from optimum_dynamo.exporters.vision_language import grid_tower_v4

    if int(transformers.__version__.split(".")[0]) >= 5:
        pytest.skip("transformers 5's towers take precomputed grid inputs (precompute_export_inputs)")
    path = save_tiny_vlm(model_type, tmp_path / "model")
    model = AutoModelForImageTextToText.from_pretrained(path).eval()
    images = tiny_vlm_processor(path, model_type).image_processor(
        images=[default_image(48, seed=1), default_image(64, seed=2).crop((0, 0, 64, 32))], return_tensors="pt")
    tower = model.model.visual
    assert grid_tower_v4.covers(tower)
    with torch.no_grad():
        expected = tower(images["pixel_values"], grid_thw=images["image_grid_thw"])
        got = grid_tower_v4.run_tower(tower, images["pixel_values"],
                                      **grid_tower_v4.grid_inputs(tower, images["image_grid_thw"]))
    if isinstance(expected, tuple):  # Qwen3-VL: (rows, DeepStack features)
        expected = {"output": expected[0], "deepstack_features": torch.stack(expected[1])}
    for name, value in (expected.items() if isinstance(expected, dict) else [("output", expected)]):
        torch.testing.assert_close(got[name] if isinstance(got, dict) else got, value, atol=1e-6, rtol=0)


@pytest.mark.once("t5")  # CI: in one environment (make test-all: both)
def test_deepstack_features_leave_the_image_graph_and_enter_the_decoder(vlm_exports):
    """Qwen3-VL adds features of the tower's early layers to the hidden states of the decoder's first layers at the
    image positions: the image graph returns them, the decoder takes them placed at every position (batch first)."""
    _, result = vlm_exports("qwen3_vl")
    assert result.layout["deepstack_layers"] == 1
    assert result.components["image_features"].output_names == ["output", "deepstack_features"]
    decoder = result.components["decoder_model"]
    assert decoder.arguments.input_names[-1] == "deepstack_visual_embeds"
    assert decoder.arguments.axis_names["deepstack_visual_embeds"][0] == "batch_size"
    for name, part in result.components.items():
        assert max(row.max_abs for row in part.discrepancies) < ATOL, name


def test_a_decoder_without_deepstack_features_is_refused_in_one_line(tmp_path):
    """The guard against a decoder that silently gives other logits: run from embeddings only (no DeepStack
    features), Qwen3-VL's decoder is not the model, and the line names what the language model took besides."""
    from optimum_dynamo.capture import observe
    from optimum_dynamo.exporters.vision_language.exporter import TextDecoder, check_decoder, decoder_calls, default_prompt, inner_parts

    path = save_tiny_vlm("qwen3_vl", tmp_path / "model")
    model = AutoModelForImageTextToText.from_pretrained(path).eval()
    processor = tiny_vlm_processor(path, "qwen3_vl")
    inputs = processor_inputs(model, processor, default_image(), default_prompt(processor, model.config))
    language = model.model.get_submodule(inner_parts(model.model, model.get_input_embeddings())["language"])
    with observe(top=model, language=language) as obs, torch.no_grad():
        model.generate(**inputs, max_new_tokens=1, do_sample=False)
    call = decoder_calls(obs["top"].calls, obs["language"].calls, None)[0]
    with pytest.raises(ExportError) as error:
        check_decoder(TextDecoder(model), call, obs["language"].calls[0])
    assert str(error.value) == (
        "the language model also takes ['deepstack_visual_embeds', 'visual_pos_masks'] from the images (features added "
        "inside its layers), which a decoder run from embeddings does not get: this model's export is not supported")
