"""A fixed subset of the zoo on every run: model types of transformers' own causal-LM and seq2seq mappings that the
sweep does not name, through the same harness `make zoo` runs (tests/zoo.py: a generically shrunk config,
the real optimum-cli in a child process, the runtime class against PyTorch's greedy tokens and logits)."""

import importlib.util

import pytest
import transformers

import zoo

ON_5 = transformers.__version__ >= "5"

# (mapping kind, model type) -> the outcome it must have ("dynamo": exported and identical)
SUBSET = {
    ("causal", "got_ocr2"): "dynamo",  # multimodal, text sizes in its text sub-config: ORTModelForCausalLM reads them
    # image-text-to-text ("pass": greedy tokens of ORTModelForImageTextToText = PyTorch's on a left-padded batch of 2)
    ("vlm", "idefics2"): "pass",  # a resampler taking a mask of ones (Projector); 4.57: patch positions and mask patched
    ("vlm", "deepseek_vl_hybrid"): "pass",  # two towers on the image: get_image_features with high_res_pixel_values
    ("vlm", "t5gemma2"): "pass",  # transformers 5: an encoder-decoder, its encoder reads the image (seq2seq layout)
    ("vlm", "idefics"): "pass",  # cross-attention to image states the prompt's step returns and decode steps read
    ("vlm", "kosmos-2"): "pass",  # generate encodes the image, then steps its text model: an image graph + the steps
}
# under `slow` (make test-all) for CI's time: their patches have unit tests of their own (test_patches.py:
# dense experts, complex rope) and afmoe's drawn router test_zero_linears_are_drawn
SLOW = {
    ("causal", "bitnet"): "dynamo",
    ("causal", "blenderbot-small"): "dynamo",
    ("causal", "glm4_moe"): "dynamo",  # transformers 4: its expert loop guards on data (dense-experts patch)
    ("causal", "llama4_text"): "dynamo",  # its rotary embedding is complex: real pairs during export
    ("causal", "afmoe"): "dynamo",  # transformers 5: its init zeroes the router (ties): the zoo draws it (zoo._draw_zero_linears)
    ("seq2seq", "nllb-moe"): "dynamo",  # transformers 5 reads `router_logits` from the encoder's own output class
    # per-layer router tuples among the encoder's outputs; transformers 5 passes use_cache on to its encoder
    ("seq2seq", "switch_transformers"): "dynamo",
    # the image a prefix of the text, no inner model: the model's own steps (vlm_steps), kosmos-2's exporter code,
    # which runs in CI (transformers 4.57)
    ("vlm", "git"): "pass",
    # any-resolution tiles packed in the runtime (its processor needs torchvision): test_vlm_runtime's llava_next
    # tiles images of other sizes and several images a prompt through the same runtime code
    ("vlm", "llava_onevision"): "pass",
}
# SUBSET rows under `slow` on transformers 5 only (CI's time): their patches are 4.57's, or our code reads them the
# same way in both (got_ocr2's text sub-config)
SLOW_ON_5 = {("vlm", "idefics2"), ("vlm", "idefics"), ("vlm", "kosmos-2"), ("causal", "got_ocr2")}
# then ORTModelForImageTextToText on the row's export, a tensor its graphs take left out: (that tensor, the error)
REFUSED_WITHOUT = {
    "deepseek_vl_hybrid": ("high_res_pixel_values", "this model's image graph needs high_res_pixel_values (the "
                                                    "processor's) beside pixel_values"),
    "kosmos-2": ("pixel_values", "this export's prompt graph reads pixel_values: pass the processor's (a prompt without "
                                 "an image is not supported by this export)"),  # the image graph makes its image_embeds
}
# then the row's export given images of another size than its graphs take: the error
RESIZED_REFUSED = {
    "git": "pixel_values of shape (2, 3, 64, 64): the exported graph takes (batch_size, 3, 32, 32), its numbers fixed "
           "at export; resize the images with the model's processor",
    "kosmos-2": "pixel_values of shape (2, 3, 64, 64): the exported graph takes (batch_size, 3, 32, 32), its numbers "
                "fixed at export; resize the images with the model's processor",
}
# then beams and sampling through ORTModelForImageTextToText on the row's export, against PyTorch's
OTHER_GENERATION = {"git", "idefics", "kosmos-2"}
# then two prompts without an image (the model's generate takes them) through the row's export, against PyTorch's
WITHOUT_IMAGE = {
    "git": ["a b c", "hello there, how are you today"],  # graphs of their own (text_prefill_model)
    "idefics": [["a b c"], ["hello there, how are you today"]],  # a prompt is a list; the processor adds pixels
    "t5gemma2": ["a b c", "hello there, how are you today"],  # an encoder graph of their own (text_encoder_model)
}
# then images of other sizes than the export's, and a prompt with two images, against PyTorch's tokens
OTHER_SIZES = {"llava_onevision"}
# rows whose processor cannot be built without torchvision (a video processor)
NEEDS_TORCHVISION = {"llava_onevision"}
# rows whose tiny model PyTorch itself cannot generate with on transformers 4.57 (the zoo's "not viable")
NOT_VIABLE_ON_4 = {"deepseek_vl_hybrid"}  # "Number of elements of source < number of ones in mask"


@pytest.mark.parametrize("kind, model_type, outcome", [
    *[pytest.param(*key, outcome, marks=pytest.mark.slow if ON_5 and key in SLOW_ON_5 else ())
      for key, outcome in SUBSET.items()],
    *[pytest.param(*key, outcome, marks=pytest.mark.slow) for key, outcome in SLOW.items()],
])
def test_zoo_subset(kind, model_type, outcome, tmp_path):
    if model_type not in zoo.population(kind):
        pytest.skip(f"{model_type} is not in this transformers' {kind} mapping")
    if model_type in NOT_VIABLE_ON_4 and not ON_5:
        pytest.skip(f"PyTorch's generate fails on the tiny {model_type} with transformers {transformers.__version__}")
    if model_type in NEEDS_TORCHVISION and importlib.util.find_spec("torchvision") is None:
        pytest.skip(f"{model_type}'s processor needs torchvision (its video processor), not installed here")
    row = zoo.run_one(model_type, tmp_path, kind)
    assert row["viable"] and row.get("outcome", row.get("status")) == outcome, row
    if model_type in OTHER_GENERATION:
        check_other_generation(tmp_path / model_type)
    if model_type in WITHOUT_IMAGE:
        check_without_image(tmp_path / model_type, WITHOUT_IMAGE[model_type])
    if model_type in OTHER_SIZES:
        check_other_sizes(tmp_path / model_type)
    if model_type in REFUSED_WITHOUT or model_type in RESIZED_REFUSED:
        import torch

        from optimum_dynamo import ORTModelForImageTextToText

        inputs = torch.load(tmp_path / model_type / "reference.pt")["inputs"]
        model = ORTModelForImageTextToText.from_pretrained(tmp_path / model_type / "onnx")
        if model_type in REFUSED_WITHOUT:
            left_out, message = REFUSED_WITHOUT[model_type]
            with pytest.raises(ValueError) as refused:
                model.generate(**{k: v for k, v in inputs.items() if k != left_out}, max_new_tokens=2)
            assert str(refused.value) == message
        if model_type in RESIZED_REFUSED:
            resized = torch.nn.functional.interpolate(inputs["pixel_values"], scale_factor=2)
            with pytest.raises(ValueError) as refused:
                model.generate(**{**inputs, "pixel_values": resized}, max_new_tokens=2)
            assert str(refused.value) == RESIZED_REFUSED[model_type]


def check_other_generation(directory):
    """Beam search (with several sequences returned) and top-k sampling under one seed: ORTModelForImageTextToText's
    tokens equal PyTorch's on the row's left-padded batch."""
    import torch
    from transformers import AutoModelForImageTextToText

    from optimum_dynamo import ORTModelForImageTextToText

    inputs = torch.load(directory / "reference.pt")["inputs"]
    models = (AutoModelForImageTextToText.from_pretrained(directory / "checkpoint").eval(),
              ORTModelForImageTextToText.from_pretrained(directory / "onnx"))
    for options in (dict(num_beams=3, num_return_sequences=2), dict(do_sample=True, top_k=5)):
        tokens = []
        for model in models:
            torch.manual_seed(0)
            with torch.no_grad():
                tokens.append(model.generate(**inputs, max_new_tokens=6, min_new_tokens=6, **options))
        assert torch.equal(*tokens), options


def check_other_sizes(directory):
    """Any-resolution tiles: the export saw one 48x48 image per prompt; a wide image beside a small one (other tile
    counts), then a prompt with two images beside one with one (LLaVA-OneVision: one tile each there), give
    PyTorch's greedy tokens through ORTModelForImageTextToText."""
    import inspect

    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from optimum_dynamo import ORTModelForImageTextToText
    from optimum_dynamo.exporters.vision_language import default_image, image_placeholder

    models = (AutoModelForImageTextToText.from_pretrained(directory / "checkpoint").eval(),
              ORTModelForImageTextToText.from_pretrained(directory / "onnx"))
    processor = AutoProcessor.from_pretrained(directory / "checkpoint")
    processor.tokenizer.padding_side = "left"
    image = image_placeholder(processor, models[0].config)
    taken = inspect.signature(models[0].forward).parameters
    for texts, images in ((["a {0} b", "hello world {0} from the lazy dog"],
                           [[default_image(seed=1).resize((100, 40))], [default_image(size=32, seed=2)]]),
                          (["two {0} and {0} b", "one {0} c"],
                           [[default_image(seed=5).resize((60, 30)), default_image(seed=6)], [default_image(size=40, seed=7)]])):
        batch = processor(images=images, text=[t.format(image) for t in texts], return_tensors="pt", padding=True)
        assert batch["image_sizes"][0].tolist() in ([40, 100], [30, 60])
        inputs = {k: v for k, v in batch.items() if k in taken}
        tokens = []
        for model in models:
            with torch.no_grad():
                tokens.append(model.generate(**inputs, max_new_tokens=6, min_new_tokens=6, do_sample=False))
        assert torch.equal(*tokens), texts


def check_without_image(directory, prompts):
    """A left-padded batch of two `prompts` without an image, greedy and with beams, then the row's prompts with their
    images again: the tokens of ORTModelForImageTextToText (saved by `save_pretrained` and loaded again: the processor
    and every graph go along) equal PyTorch's."""
    import inspect

    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from optimum_dynamo import ORTModelForImageTextToText

    ORTModelForImageTextToText.from_pretrained(directory / "onnx").save_pretrained(directory / "saved")
    models = (AutoModelForImageTextToText.from_pretrained(directory / "checkpoint").eval(),
              ORTModelForImageTextToText.from_pretrained(directory / "saved"))
    processor = AutoProcessor.from_pretrained(directory / "saved")
    processor.tokenizer.padding_side = "left"
    batch = processor(text=prompts, return_tensors="pt", padding=True)
    taken = inspect.signature(models[0].forward).parameters
    text = {k: v for k, v in batch.items() if k in taken}
    assert text["attention_mask"][0, 0] == 0  # row 0 is padded on the left
    with_images = torch.load(directory / "reference.pt")["inputs"]
    for inputs, options in ((text, {}), (text, dict(num_beams=3, num_return_sequences=2)), (with_images, {})):
        tokens = []
        for model in models:
            with torch.no_grad():
                tokens.append(model.generate(**inputs, max_new_tokens=6, min_new_tokens=6, do_sample=False, **options))
        assert torch.equal(*tokens), options


def test_zero_linears_are_drawn():
    """afmoe's init zeroes its router: the zoo draws such weights (ties would route by each runtime's
    tie-breaking), and leaves every other weight as the model's init made it."""
    import torch
    import transformers

    if "afmoe" not in zoo.population():
        pytest.skip("afmoe is not in this transformers' causal-LM mapping")
    torch.manual_seed(0)
    config = zoo.tiny_config("afmoe")
    model = transformers.AutoModelForCausalLM.from_config(config)
    before = {n: p.clone() for n, p in model.named_parameters()}
    zoo._draw_zero_linears(model, config)
    changed = [n for n, p in model.named_parameters() if not torch.equal(p, before[n])]
    assert changed and all(n.endswith("router.gate.weight") for n in changed)
    assert all(p.any() for n, p in model.named_parameters() if n in changed)
