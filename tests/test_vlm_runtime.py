"""ORTModelForImageTextToText over real `export_vlm` graphs (each family's tiny model, random weights):
transformers' `generate` through onnxruntime gives PyTorch's tokens on left-padded batches, with and
without images, several images per prompt, sampling with a seed and beam search; it saves and loads
like an optimum ORTModel."""

import importlib.util
import inspect
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from PIL import Image
from transformers import AutoModelForImageTextToText, AutoProcessor, GenerationConfig

from optimum_dynamo import ORTModelForImageTextToText
from optimum_dynamo.exporters.vision_language import default_image, image_placeholder
from optimum_dynamo.manifest import read_manifest
from tiny import tiny_vlm_processor

NEW_TOKENS = 8
GREEDY = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)


TORCHVISION = importlib.util.find_spec("torchvision") is not None
# families whose processor transformers cannot load without torchvision (a video part): there, exported with the
# processor the tests build (tests/tiny.py), through `export_vlm`; every family where torchvision is installed, and
# the others everywhere, as users do: `from_pretrained(export=True, dynamo=True)` with the checkpoint's own processor
BUILT_PROCESSOR = set() if TORCHVISION else {"internvl", "qwen2_vl", "qwen2_5_vl", "qwen3_vl"}


ON_5 = transformers.__version__ >= "5"
# families under `slow` (CI's time), each exported by the same code as a family that runs there: LLaVA's (a tower, a
# projector, the decoder; llava runs in both) for aya_vision, internvl, mistral3; idefics3's and smolvlm's (one
# runs in each); the Qwen-VL grid tower of qwen2_5_vl (qwen2_vl runs on transformers 4, qwen3_vl on both). And in
# one environment each: paligemma (5), llava_next (4)
SLOW_ON_5 = {"aya_vision", "smolvlm", "qwen2_vl", "llava_next", "internvl", "mistral3"}
SLOW_ON_4 = {"internvl", "mistral3", "idefics3", "qwen2_5_vl", "paligemma"}
FAMILIES = ["gemma3", "llava", "aya_vision", "paligemma", "internvl", "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "llava_next",
            "mistral3", "idefics3", "smolvlm"]


@pytest.fixture(scope="module", params=[pytest.param(f, marks=pytest.mark.slow) if f in (SLOW_ON_5 if ON_5 else SLOW_ON_4)
                                        else f for f in FAMILIES])
def exported(request, vlm_exports, vlm_models):
    """(PyTorch model, ORTModelForImageTextToText, processor, the export's directory)."""
    try:
        if request.param in BUILT_PROCESSOR:
            path, result = vlm_exports(request.param)
            ort = ORTModelForImageTextToText.from_pretrained(result.output)
        else:
            path, ort = vlm_models(request.param)
    except ImportError as e:  # transformers 5's PixtralProcessor without torchvision (not installed here)
        if "torchvision" not in str(e).lower():
            raise
        pytest.skip(f"{request.param}: {str(e).strip().split(' but ')[0]} (not installed here)")
    model = AutoModelForImageTextToText.from_pretrained(path).eval()
    processor = tiny_vlm_processor(path, request.param)
    processor.tokenizer.padding_side = "left"
    return model, ort, processor, Path(ort.model_save_dir)


def _inputs(model, processor, texts, images=None, **options):
    """The processor's batch, padded, without the keys `model.forward` does not take (the tiny tokenizer's
    token types, which LLaVA's `generate` refuses)."""
    placeholder = image_placeholder(processor, model.config)
    batch = processor(images=images, text=[t.format(image=placeholder) for t in texts], return_tensors="pt", padding=True,
                      **options)
    params = inspect.signature(model.forward).parameters
    return {k: v for k, v in batch.items() if k in params and k != "labels"}


def _both(model, ort, inputs, seed=None, **options):
    outputs = []
    for runner in (model, ort):
        if seed is not None:
            torch.manual_seed(seed)
        with torch.no_grad():
            outputs.append(runner.generate(**inputs, **options).tolist())
    return outputs


def _two_images(model, processor):
    texts = ["the quick {image} brown fox", "hello world {image} from the lazy dog over and over"]
    return _inputs(model, processor, texts, [[default_image(seed=1)], [default_image(seed=2)]])


def test_greedy_tokens_equal_pytorch_on_a_left_padded_batch(exported):
    model, ort, processor, _ = exported
    inputs = _two_images(model, processor)
    assert inputs["attention_mask"][0, 0] == 0 and inputs["attention_mask"][1].all()  # row 0 is padded on the left
    expected, tokens = _both(model, ort, inputs, **GREEDY)
    assert tokens == expected


def test_prompts_without_an_image(exported):
    model, ort, processor, _ = exported
    if model.config.model_type == "paligemma":
        pytest.skip("PaliGemma's processor refuses text without images (`images` are expected)")
    inputs = _inputs(model, processor, ["the quick brown fox", "hello world"])
    assert "pixel_values" not in inputs
    expected, tokens = _both(model, ort, inputs, **GREEDY)
    assert tokens == expected


def test_sampling_with_a_seed_gives_pytorch_s_tokens(exported):
    model, ort, processor, _ = exported
    inputs = _two_images(model, processor)
    options = dict(GREEDY, do_sample=True, top_k=20, top_p=0.9, temperature=0.7)
    expected, tokens = _both(model, ort, inputs, seed=3, **options)
    assert tokens == expected
    assert _both(model, ort, inputs, seed=4, **options)[1] != tokens  # the seed matters


def test_beam_search_reorders_the_past(exported):
    model, ort, processor, _ = exported
    expected, tokens = _both(model, ort, _two_images(model, processor), **dict(GREEDY, num_beams=3))
    assert tokens == expected


def test_several_images_in_one_prompt(exported):
    model, ort, processor, _ = exported
    images = [[default_image(seed=4), default_image(seed=5)], [default_image(seed=6)]]
    inputs = _inputs(model, processor, ["a {image} b {image} c", "the {image} quick brown fox"], images)
    pixels = inputs["pixel_values"]
    if ort.layout.get("padded_images"):  # (prompts, tiles of their images, C, H, W), padded with zero images (Idefics3)
        tiles = int(pixels[1].flatten(1).any(1).sum())  # of one image
        assert pixels.shape[1] == 2 * tiles
        swapped = dict(inputs, pixel_values=pixels.clone())
        swapped["pixel_values"][0] = torch.cat([pixels[0, tiles:], pixels[0, :tiles]])
    else:
        assert inputs.get("image_grid_thw", pixels).shape[0] == 3  # Qwen2-VL: rows of patches, a grid per image
        swapped = {k: v[[1, 0, 2]] if k in ("pixel_values", "image_sizes") else v for k, v in inputs.items()}
    if "image_grid_thw" in inputs:  # the images' blocks of patches swapped (same sizes here)
        blocks = pixels.split(inputs["image_grid_thw"].prod(-1).tolist())
        swapped["pixel_values"] = torch.cat([blocks[1], blocks[0], blocks[2]])
    expected, tokens = _both(model, ort, inputs, **GREEDY)
    assert tokens == expected
    expected, tokens = _both(model, ort, swapped, **GREEDY)
    assert tokens == expected
    with torch.no_grad():  # the order matters (tokens alone may not show it: tiny Aya Vision barely reads images)
        assert not torch.allclose(ort(**swapped).logits, ort(**inputs).logits, atol=1e-6)


def test_images_split_in_tiles(exported):
    """Processors that cut an image into tiles of the exported size (`crop_to_patches`): more rows of pixels, in order."""
    model, ort, processor, _ = exported
    if not hasattr(processor.image_processor, "crop_to_patches"):
        pytest.skip(f"{type(processor.image_processor).__name__} does not cut images into tiles")
    wide = default_image(seed=7).resize((100, 40))
    texts = ["the quick {image} brown fox", "hello world {image} from the lazy dog over and over"]
    inputs = _inputs(model, processor, texts, [[wide], [default_image(seed=8)]])
    tiled = _inputs(model, processor, texts, [[wide], [default_image(seed=8)]], crop_to_patches=True, max_patches=4)
    assert tiled["pixel_values"].shape[0] > inputs["pixel_values"].shape[0]
    expected, tokens = _both(model, ort, tiled, **GREEDY)
    assert tokens == expected


def test_image_tokens_without_pixels_are_refused(exported):
    model, ort, processor, _ = exported
    inputs = {k: v for k, v in _two_images(model, processor).items() if k != "pixel_values"}
    with pytest.raises(ValueError, match=r"^\d+ image tokens in the prompt but no pixel_values$"):
        ort.generate(**inputs, **GREEDY)


def test_an_image_size_not_exported_is_refused(exported):
    """The processors of these families resize to one size (LLaVA-Next: tiles of one size); the graph's size is
    fixed: another is refused."""
    model, ort, processor, _ = exported
    if "grid_inputs" in ort.layout or ort.layout.get("image_sizes") == "pixels":
        pytest.skip("images at their own size: the image graph's sizes are dynamic (test_an_unseen_image_size)")
    inputs = _two_images(model, processor)
    pixels = inputs["pixel_values"]
    other = torch.nn.functional.interpolate(pixels.flatten(0, -4), size=(pixels.shape[-2] + 8, pixels.shape[-1] + 8))
    other = other.reshape(*pixels.shape[:-2], *other.shape[-2:])  # Idefics3: (prompts, tiles, C, H, W)
    size = "x".join(map(str, pixels.shape[-3:]))
    with pytest.raises(ValueError, match=rf"^pixel_values of shape \({', '.join(map(str, other.shape))}\): the "
                                         rf"exported image graph takes images of {size} \(fixed at export\); "
                                         "resize them with the model's processor$"):
        ort.generate(**dict(inputs, pixel_values=other), **GREEDY)


def test_an_image_size_not_seen_at_export(exported):
    """Qwen2-VL's image graph is dynamic in patches and images (the capture saw 48x48, 32x32 and 48x32 images):
    a 64x32 and a 32x48 image give PyTorch's tokens."""
    model, ort, processor, _ = exported
    if "grid_inputs" not in ort.layout:
        pytest.skip("the image graph of this family is fixed to one size (test_an_image_size_not_exported_is_refused)")
    images = [[default_image(64, seed=1).resize((64, 32))], [default_image(48, seed=2).resize((32, 48))]]
    inputs = _inputs(model, processor, ["the quick {image} brown fox", "hello world {image} from the lazy dog"], images)
    assert inputs["image_grid_thw"].tolist() == [[1, 4, 8], [1, 6, 4]]
    expected, tokens = _both(model, ort, inputs, **GREEDY)
    assert tokens == expected


def test_tiles_of_images_of_other_sizes(exported):
    """LLaVA-Next's processor tiles an image by its size (the export saw one 48x48 image, 5 tiles): a wide and a
    small image, neither of that size, another tile count each, give PyTorch's tokens; the runtime counts the
    tiles and unpads their grid per image."""
    model, ort, processor, _ = exported
    if not ort.layout.get("tiles"):
        pytest.skip("the processor does not tile images by their size")
    texts = ["the quick {image} brown fox", "hello world {image} from the lazy dog over and over"]
    inputs = _inputs(model, processor, texts, [[default_image(seed=1).resize((100, 40))], [default_image(size=32, seed=2)]])
    assert inputs["image_sizes"].tolist() == [[40, 100], [32, 32]] and inputs["pixel_values"].shape[1] == 3
    expected, tokens = _both(model, ort, inputs, **GREEDY)
    assert tokens == expected
    inputs = _inputs(model, processor, texts, [[default_image(seed=3).resize((30, 70))], [default_image(size=64, seed=4)]])
    assert inputs["pixel_values"].shape[1] == 5
    expected, tokens = _both(model, ort, inputs, **GREEDY)
    assert tokens == expected


def test_an_unseen_image_size(exported):
    """Pixtral's images keep their size: the capture saw two, a third works (a batch padded to the largest)."""
    model, ort, processor, _ = exported
    if ort.layout.get("image_sizes") != "pixels":
        pytest.skip("the image graph's size is fixed at export (test_an_image_size_not_exported_is_refused)")
    texts = ["the quick {image} brown fox", "hello world {image} from the lazy dog over and over"]
    images = [[default_image(seed=1).resize((48, 64))], [default_image(size=32, seed=2)]]
    inputs = _inputs(model, processor, texts, images)
    assert inputs["image_sizes"].tolist() == [[64, 48], [32, 32]]
    expected, tokens = _both(model, ort, inputs, **GREEDY)
    assert tokens == expected
    with pytest.raises(ValueError, match=r"^an image of 40x48: the exported image graph takes heights and widths that "
                                         r"are multiples of 16 \(whole merged patches\); resize it with the model's "
                                         "processor$"):
        ort.generate(**dict(inputs, image_sizes=torch.tensor([[40, 48], [32, 32]])), **GREEDY)


def test_images_split_into_another_number_of_tiles(exported):
    """Idefics3's processor splits an image into tiles by its size: the tile axis is dynamic, all-zero padding
    images are dropped by the runtime; the tile size is fixed, and a pixel mask hiding part of a tile is refused."""
    model, ort, processor, _ = exported
    if "pixel_attention_mask" not in inspect.signature(model.forward).parameters:
        pytest.skip("the processor resizes every image to one size (no tiles)")
    wide = Image.fromarray(np.random.default_rng(7).integers(0, 256, (20, 60, 3), dtype=np.uint8))
    inputs = _inputs(model, processor, ["the quick {image} brown fox", "hello world {image} from the lazy dog"],
                     [[wide], [default_image(seed=2)]])
    assert inputs["pixel_values"].shape[1] == 5 and not inputs["pixel_values"][0].flatten(1).any(1).all()
    expected, tokens = _both(model, ort, inputs, **GREEDY)
    assert tokens == expected
    mask = inputs["pixel_attention_mask"].clone()
    mask[1, 0, :, -1] = 0
    with pytest.raises(ValueError, match=r"^pixel_attention_mask masks part of an image: the exported image graph "
                                         r"takes whole images \(tiles\) without a pixel mask$"):
        ort.generate(**dict(inputs, pixel_attention_mask=mask), **GREEDY)


def test_behaves_like_an_optimum_ortmodel(exported):
    model, ort, _, directory = exported
    assert type(ort.config) is type(model.config) and ort.config.model_type == model.config.model_type
    assert ort.generation_config.to_dict() == GenerationConfig.from_pretrained(directory).to_dict()
    assert (ort.generation_config.pad_token_id, ort.generation_config.eos_token_id) == (0, 2)
    assert ort.device == torch.device("cpu") and ort.dtype == torch.float32
    assert ort.can_generate() and ort.main_input_name == "input_ids"
    with pytest.raises(ValueError, match="the torchscript exporter has no export for image-text-to-text"):
        ORTModelForImageTextToText.from_pretrained(model.name_or_path, export=True, dynamo=False)


def test_the_export_matches_pytorch_on_its_captured_calls(exported):
    """Each component graph within 1e-4 of PyTorch on every call the capture recorded (the manifest's record)."""
    _, ort, _, directory = exported
    records = read_manifest(directory)["components"]
    assert sorted(records) == sorted(ort.layout["components"])
    for name, record in records.items():
        assert {row["output"] for row in record["discrepancies"]} == set(record["outputs"]), name
        assert max(row["max_abs"] for row in record["discrepancies"]) < 1e-4, name


def test_save_pretrained_round_trip(exported, tmp_path):
    model, ort, processor, directory = exported
    ort.save_pretrained(tmp_path / "saved")
    saved = sorted(p.relative_to(tmp_path / "saved").as_posix() for p in (tmp_path / "saved").rglob("*") if p.is_file())
    for relative in ort.layout["components"].values():  # the layout's graphs (paligemma on 4.57: image_features)
        assert relative in saved
    assert {"vlm.json", "config.json", "generation_config.json"} <= set(saved)  # and the processor: loaded below
    assert json.loads((tmp_path / "saved" / "vlm.json").read_text()) == ort.layout
    again = ORTModelForImageTextToText.from_pretrained(tmp_path / "saved")
    assert again.model_save_dir == tmp_path / "saved"
    assert again.generation_config.to_dict() == ort.generation_config.to_dict()
    if ort.preprocessors:  # Qwen2-VL's processor does not load here (its video processor needs torchvision)
        assert type(AutoProcessor.from_pretrained(tmp_path / "saved")) is type(processor)
    inputs = _two_images(model, processor)
    with torch.no_grad():
        assert again.generate(**inputs, **GREEDY).tolist() == ort.generate(**inputs, **GREEDY).tolist()
