"""`--dynamo` for non-generative tasks: CLI export, the matching ORTModel class, parity with PyTorch
at a batch size and sequence length (or image size) not seen during capture."""

import inspect

import pytest
import torch
import transformers
from optimum.exporters.tasks import TasksManager
from transformers import AutoTokenizer, ViTImageProcessor

import optimum.onnxruntime as ort
from optimum_dynamo.capture.samples import main_input, vocab_size
from optimum_dynamo.manifest import read_manifest
from tiny import save_tiny_model, tiny_config, tiny_tokenizer

from conftest import optimum_cli

ATOL = 1e-4
# CI runs each in one environment (make test-all: both); the tasks' zoo runs every type of their mappings
CASES = [pytest.param(*case, marks=pytest.mark.once(env)) for *case, env in [
    ("bert", "fill-mask", "ORTModelForMaskedLM", "t4"),
    ("bert", "feature-extraction", "ORTModelForFeatureExtraction", "t5"),
    ("roberta", "token-classification", "ORTModelForTokenClassification", "t5"),
    ("distilbert", "question-answering", "ORTModelForQuestionAnswering", "t4"),
    ("deberta-v2", "text-classification", "ORTModelForSequenceClassification", "t5"),
    ("electra", "multiple-choice", "ORTModelForMultipleChoice", "t4"),
    ("vit", "image-classification", "ORTModelForImageClassification", "t5"),
    ("convnext", "image-classification", "ORTModelForImageClassification", "t4"),
    ("resnet", "image-classification", "ORTModelForImageClassification", "t5"),
]]
# Batch 4, sequence 7: capture ran batches 2 and 3 at other lengths.
TEXTS = ["the quick brown fox jumps over the", "hello world", "a tiny model", "optimum exports models to onnx"]


def _inputs(model_type, task, path):
    if task == "image-classification":
        size = 32 if model_type == "vit" else 40  # vit is fixed-size; the others take any size
        return {"pixel_values": torch.randn(4, 3, size, size, generator=torch.Generator().manual_seed(1))}
    tokenizer = AutoTokenizer.from_pretrained(path)
    batch = dict(tokenizer(TEXTS, return_tensors="pt", padding=True))
    assert batch["input_ids"].shape == (4, 7)
    if model_type == "distilbert":
        batch.pop("token_type_ids", None)  # distilbert takes none
    if task == "multiple-choice":  # 2 questions x 2 choices
        batch = {k: v.reshape(2, 2, -1) for k, v in batch.items()}
    return batch


@pytest.mark.parametrize("model_type,task,runtime_class", CASES)
def test_cli_export_loads_in_runtime_class_with_parity(model_type, task, runtime_class, tmp_path):
    checkpoint = save_tiny_model(model_type, task, tmp_path / "checkpoint")
    if model_type == "vit":  # a checkpoint with an image processor: capture goes through it
        ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(checkpoint)
    out = tmp_path / "onnx"
    run = optimum_cli("export", "onnx", "--dynamo", "--model", checkpoint, "--task", task, out)
    assert run.returncode == 0, run.stderr[-3000:]
    assert read_manifest(out)["task"] == task
    assert (out / "preprocessor_config.json").exists() == (model_type == "vit")

    ort_model = getattr(ort, runtime_class).from_pretrained(out)
    torch_model = TasksManager.get_model_class_for_task(task).from_pretrained(checkpoint).eval()
    inputs = _inputs(model_type, task, checkpoint)
    with torch.no_grad():
        expected = torch_model(**inputs)
    got = ort_model(**inputs)
    compared = 0
    for name, value in expected.items():
        if isinstance(value, torch.Tensor) and name in got:
            diff = (got[name] - value).abs().max().item()
            assert diff < ATOL, f"{name} differs by {diff:.3e}"
            compared += 1
    assert compared >= 1


# Tasks of other modalities and models: one forward each, the model of the task's form (CTC for speech recognition
# by wav2vec2), checked at batch 4 (capture ran 2 and 3). Checkpoints without preprocessor files, as many are.
ON_5 = transformers.__version__ >= "5"
# under `slow` in one environment (CI's time): the same driver runs there on another row (waveforms: wav2vec2;
# images: yolos)
_SLOW = pytest.mark.slow
OTHER_CASES = [
    pytest.param("llama", "feature-extraction", "ORTModelForFeatureExtraction", "AutoModel",
                 marks=pytest.mark.once("t5")),  # a decoder's hidden states
    pytest.param("wav2vec2", "automatic-speech-recognition", "ORTModelForCTC", "AutoModelForCTC",
                 marks=pytest.mark.once("t5")),  # CI: one environment (make test-all: both)
    pytest.param("hubert", "audio-classification", "ORTModelForAudioClassification", "AutoModelForAudioClassification",
                 marks=() if ON_5 else _SLOW),
    pytest.param("segformer", "semantic-segmentation", "ORTModelForSemanticSegmentation",
                 "AutoModelForSemanticSegmentation", marks=_SLOW if ON_5 else ()),
    pytest.param("yolos", "object-detection", "ORTModelForCustomTasks", "AutoModelForObjectDetection",
                 marks=pytest.mark.once("t4")),  # optimum has no class
    pytest.param("clip", "zero-shot-image-classification", "ORTModelForZeroShotImageClassification",
                 "AutoModelForZeroShotImageClassification",
                 marks=pytest.mark.once("t5")),  # 4 label texts x 5 images (capture: 2 x 3, 3 x 2)
    # a dual encoder's features: both towers' embeddings (optimum's feature-extraction class reads one
    # last_hidden_state)
    pytest.param("clip", "feature-extraction", "ORTModelForCustomTasks", "AutoModel", marks=pytest.mark.once("t5")),
    # one outside the zero-shot mapping (GroupViT), told by its model's text and image embedding methods
    pytest.param("groupvit", "feature-extraction", "ORTModelForCustomTasks", "AutoModel", marks=pytest.mark.once("t4")),
    # a vision tower whose class names `input_ids` its main input (inherited), but whose forward takes pixels
    pytest.param("idefics3_vision", "feature-extraction", "ORTModelForFeatureExtraction", "AutoModel",
                 marks=pytest.mark.once("t5")),
    # under `slow` (make test-all): drivers of the rows above, other heads and runtime classes
    pytest.param("glpn", "depth-estimation", "ORTModelForCustomTasks", "AutoModelForDepthEstimation", marks=_SLOW),
    pytest.param("wav2vec2", "audio-frame-classification", "ORTModelForAudioFrameClassification",
                 "AutoModelForAudioFrameClassification", marks=_SLOW),
    pytest.param("wav2vec2:xvector", "audio-xvector", "ORTModelForAudioXVector", "AutoModelForAudioXVector", marks=_SLOW),
]


def _other_inputs(model, path):
    g = torch.Generator().manual_seed(1)
    main = main_input(model)
    if main == "pixel_values":
        return {"pixel_values": torch.randn(4, 3, 32, 32, generator=g)}
    if main == "input_values":
        return {"input_values": torch.randn(4, 6000, generator=g) * 0.3}
    batch = dict(AutoTokenizer.from_pretrained(path)(TEXTS, return_tensors="pt", padding=True))
    batch = {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask")}
    if "pixel_values" in inspect.signature(model.forward).parameters:
        side = getattr(getattr(model.config, "vision_config", None), "image_size", 32)
        batch["pixel_values"] = torch.randn(5, 3, side, side, generator=g)
    return batch


@pytest.mark.parametrize("model_type,task,runtime_class,auto_class", OTHER_CASES)
def test_other_tasks_load_in_runtime_class_with_parity(model_type, task, runtime_class, auto_class, tmp_path):
    import transformers

    checkpoint = tmp_path / "checkpoint"
    torch.manual_seed(0)
    getattr(transformers, auto_class).from_config(tiny_config(model_type)).eval().save_pretrained(checkpoint)
    if model_type in ("llama", "clip", "groupvit"):
        tiny_tokenizer(128).save_pretrained(checkpoint)
    out = tmp_path / "onnx"
    run = optimum_cli("export", "onnx", "--dynamo", "--no-fallback", "--model", checkpoint, "--task", task, out)
    assert run.returncode == 0, run.stderr[-3000:]
    assert read_manifest(out)["task"] == task

    torch_model = getattr(transformers, auto_class).from_pretrained(checkpoint).eval()
    inputs = _other_inputs(torch_model, checkpoint)
    ort_model = getattr(ort, runtime_class).from_pretrained(out)
    with torch.no_grad():
        expected = torch_model(**inputs)
    got = ort_model(**inputs)
    keep = inputs.get("attention_mask")
    compared = 0
    for name, value in expected.items():
        if isinstance(value, torch.Tensor) and name in got:
            if keep is not None and value.shape[:2] == keep.shape:  # hidden states: real positions only
                value, other = value[keep.bool()], torch.as_tensor(got[name])[keep.bool()]
            else:
                other = torch.as_tensor(got[name])
            diff = (other - value).abs().max().item()
            assert diff < ATOL, f"{name} differs by {diff:.3e}"
            compared += 1
    assert compared >= 1


# Log-mel models whose checkpoints ship their feature extractor (mask included): the graph takes both, and the
# runtime class of the task feeds them (legacy_bridge.ort_audio). One in CI (its time), the rest under `slow`.
FEATURE_CASES = [
    pytest.param("wav2vec2-bert", "automatic-speech-recognition", "SeamlessM4TFeatureExtractor", "ORTModelForCTC",
                 "AutoModelForCTC", marks=() if ON_5 else _SLOW),
    pytest.param("wav2vec2-bert", "audio-classification", "SeamlessM4TFeatureExtractor",
                 "ORTModelForAudioClassification", "AutoModelForAudioClassification", marks=_SLOW),
    pytest.param("wav2vec2-bert", "audio-frame-classification", "SeamlessM4TFeatureExtractor",
                 "ORTModelForAudioFrameClassification", "AutoModelForAudioFrameClassification", marks=_SLOW),
    pytest.param("wav2vec2-bert", "audio-xvector", "SeamlessM4TFeatureExtractor", "ORTModelForAudioXVector",
                 "AutoModelForAudioXVector", marks=_SLOW if ON_5 else ()),  # its pooling of a masked batch
    pytest.param("parakeet_ctc", "automatic-speech-recognition", "ParakeetFeatureExtractor", "ORTModelForCTC",
                 "AutoModelForCTC", marks=[_SLOW, pytest.mark.skipif(not ON_5, reason="transformers 4.57's Parakeet "
                                                                      "extractor needs librosa, not installed here")]),
]


@pytest.mark.parametrize("model_type,task,extractor,runtime_class,auto_class", FEATURE_CASES)
def test_speech_features_with_their_mask(model_type, task, extractor, runtime_class, auto_class, tmp_path):
    import numpy as np

    checkpoint, out = tmp_path / "checkpoint", tmp_path / "onnx"
    torch.manual_seed(0)
    model = getattr(transformers, auto_class).from_config(tiny_config(model_type)).eval()
    model.save_pretrained(checkpoint)
    bins = getattr(model.config, "encoder_config", model.config)
    features = getattr(transformers, extractor)(**({"feature_size": bins.num_mel_bins}
                                                   if hasattr(bins, "num_mel_bins") else {}))
    features.save_pretrained(checkpoint)
    run = optimum_cli("export", "onnx", "--dynamo", "--no-fallback", "--model", checkpoint, "--task", task, out)
    assert run.returncode == 0, run.stderr[-3000:]

    ort_model = getattr(ort, runtime_class).from_pretrained(out)
    assert list(ort_model.input_names) == ["input_features", "attention_mask"]
    rng = np.random.default_rng(1)
    clips = [0.3 * rng.standard_normal(n).astype(np.float32) for n in (16000, 9000, 12000, 4000)]  # 4: capture ran 2, 3
    inputs = dict(features(clips, sampling_rate=16000, return_tensors="pt", padding=True))
    assert not inputs["attention_mask"].all()  # padded rows
    with torch.no_grad():
        expected = model(**inputs).logits
    diff = (torch.as_tensor(ort_model(**inputs).logits) - expected).abs().max().item()
    assert diff < ATOL, f"logits differ by {diff:.3e}"


@pytest.mark.slow
@pytest.mark.skipif(not ON_5, reason="OmniASR is new in transformers 5")
def test_a_mask_the_runtime_class_cannot_feed_is_named(tmp_path):
    """OmniASR's extractor gives a `padding_mask` its forward takes; ORTModelForCTC feeds none, so the graph takes
    none: the export says so in one line, and the graph matches PyTorch without the mask."""
    import numpy as np

    checkpoint, out = tmp_path / "checkpoint", tmp_path / "onnx"
    torch.manual_seed(0)
    model = transformers.AutoModelForCTC.from_config(tiny_config("omniasr_ctc")).eval()
    model.save_pretrained(checkpoint)
    transformers.OmniASRFeatureExtractor().save_pretrained(checkpoint)  # gives the mask (return_attention_mask)
    run = optimum_cli("export", "onnx", "--dynamo", "--no-fallback", "--model", checkpoint, "--task",
                      "automatic-speech-recognition", out)
    assert run.returncode == 0, run.stderr[-3000:]
    assert ("    padding_mask: OmniASRForCTC takes it and the preprocessor gives it, but ORTModelForCTC feeds none: the "
            "graph takes none (rows the preprocessor padded differ from PyTorch's with it)") in run.stderr.splitlines()
    ort_model = ort.ORTModelForCTC.from_pretrained(out)
    assert list(ort_model.input_names) == ["input_values"]
    clips = torch.as_tensor(0.3 * np.random.default_rng(1).standard_normal((4, 1, 9000)), dtype=torch.float32)
    with torch.no_grad():
        expected = model(input_values=clips).logits
    assert (torch.as_tensor(ort_model(input_values=clips).logits) - expected).abs().max().item() < ATOL


@pytest.mark.skipif(not hasattr(transformers, "PPLCNetForImageClassification"), reason="PP-LCNet is new in "
                    "transformers 5")
def test_a_model_without_the_output_the_runtime_class_reads_is_refused(tmp_path):
    """PP-LCNet's classifier returns its class scores as `last_hidden_state`; ORTModelForImageClassification reads
    `logits`: the export is refused in one line, before torch.export, and nothing is written."""
    import zoo

    checkpoint, out = tmp_path / "checkpoint", tmp_path / "onnx"
    config = zoo.tiny_config("pp_lcnet", zoo.TINY_VISION, stages=True)
    transformers.AutoModelForImageClassification.from_config(config).save_pretrained(checkpoint)
    run = optimum_cli("export", "onnx", "--dynamo", "--model", checkpoint, "--task", "image-classification", out)
    assert run.returncode != 0
    assert run.stderr.splitlines()[-1] == (
        "optimum-cli export onnx --dynamo: error: dynamo export failed (PipelineError: PPLCNetForImageClassification "
        "returns no logits (it returns last_hidden_state), which ORTModelForImageClassification reads); no fallback: "
        "no torchscript OnnxConfig for pp_lcnet/image-classification")
    assert not out.exists()


# one each (CI's time): transformers 4's tiny tokenizer makes token types (the warning), transformers 5's does not
@pytest.mark.parametrize("files", [pytest.param("bare", marks=() if ON_5 else _SLOW),
                                   pytest.param("tokenizer", marks=_SLOW if ON_5 else ())])
def test_token_types_the_model_computes_itself(files, tmp_path):
    """BigBird's question answering computes its token types from the question's length when given none, not
    zeros (what the runtime class feeds then). A checkpoint without a tokenizer: the graph takes no token types and
    computes the model's own (parity without them), as with a tokenizer that makes none. With a tokenizer that makes
    them: the graph takes them and the export says what a user who leaves them out gets."""
    import transformers

    checkpoint, out = tmp_path / "checkpoint", tmp_path / "onnx"
    torch.manual_seed(0)
    config = tiny_config("big_bird", max_position_embeddings=64, sep_token_id=2)
    transformers.BigBirdForQuestionAnswering(config).eval().save_pretrained(checkpoint)
    if files == "tokenizer":
        tiny_tokenizer(128).save_pretrained(checkpoint)
    run = optimum_cli("export", "onnx", "--dynamo", "--no-fallback", "--model", checkpoint, "--task",
                      "question-answering", out)
    assert run.returncode == 0, run.stderr[-3000:]
    makes = files == "tokenizer" and "token_type_ids" in AutoTokenizer.from_pretrained(checkpoint)("a b")
    warning = ("    token_type_ids: BigBirdForQuestionAnswering computes its own when given none, not zeros; "
               "ORTModelForQuestionAnswering feeds zeros when given none: pass the tokenizer's token_type_ids")
    assert (warning in run.stderr.splitlines()) == makes
    ort_model = ort.ORTModelForQuestionAnswering.from_pretrained(out)
    assert ("token_type_ids" in ort_model.input_names) == makes
    if not makes:
        torch_model = transformers.BigBirdForQuestionAnswering.from_pretrained(checkpoint).eval()
        ids = torch.randint(3, 128, (4, 9), generator=torch.Generator().manual_seed(3))
        mask = torch.ones_like(ids)
        mask[0, :3] = 0
        with torch.no_grad():
            expected = torch_model(input_ids=ids, attention_mask=mask)
        got = ort_model(input_ids=ids, attention_mask=mask)
        for name in ("start_logits", "end_logits"):
            assert (got[name] - expected[name])[mask.bool()].abs().max().item() < ATOL


@pytest.mark.once("t5")
def test_a_batch_read_with_len_stays_an_axis(tmp_path):
    """RT-DETR reads its batch size with Python's `len()`, which non-strict tracing makes a number (the batch fixed);
    the export traces it again in strict mode, where it stays a size. With --no-fallback, the detector's graph runs
    a batch of 4 (the capture ran 2 and 3) as PyTorch does."""
    import zoo
    import zoo_tasks

    checkpoint, out = tmp_path / "checkpoint", tmp_path / "onnx"
    torch.manual_seed(0)
    model = transformers.AutoModelForObjectDetection.from_config(
        zoo.tiny_config("rt_detr", zoo_tasks.TINY_IMAGE, stages=True)).eval()
    zoo_tasks.off_initial_values(model, every_weight=True)  # the top-k of tied query scores: in no particular order
    model.save_pretrained(checkpoint)
    run = optimum_cli("export", "onnx", "--dynamo", "--no-fallback", "--model", checkpoint, "--task",
                      "object-detection", out)
    assert run.returncode == 0, run.stderr[-3000:]
    pixels = torch.randn(4, 3, 64, 64, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        expected = model(pixel_values=pixels)
    got = ort.ORTModelForCustomTasks.from_pretrained(out)(pixel_values=pixels)
    for name in ("logits", "pred_boxes"):
        assert (torch.as_tensor(got[name]) - expected[name]).abs().max().item() < ATOL, name


# (model type, task, auto class, runtime class, config values): what the shared layers had to learn for a kind of
# model
KIND_CASES = [
    # LED's encoder is Longformer's: with no global attention, its local-only path, its window padding by a
    # symbolic length (the sequence stays an axis); before: GuardOnDataDependentSymNode. A window of 4: 7 tokens are
    # padded to 8. Under `slow` (its translation alone takes 18 s): CI runs test_patches' LED encoder test
    pytest.param("led", "question-answering", "AutoModelForQuestionAnswering", "ORTModelForQuestionAnswering",
                 {"attention_window": 4}, marks=_SLOW),
    # a base model that reads use_cache from its config, not its arguments: traced as the capture ran it, without
    # the cache (before: "graph has 5 outputs, expected 1")
    pytest.param("omniasr", "feature-extraction", "AutoModel", "ORTModelForFeatureExtraction", {},
                 marks=pytest.mark.skipif(not hasattr(transformers, "OmniASRModel"), reason="new in transformers 5.24")),
    # a padding mask the model drops when nothing is padded (`fsmt_padding_mask`): kept (before:
    # GuardOnDataDependentSymNode)
    pytest.param("fsmt", "feature-extraction", "AutoModel", "ORTModelForFeatureExtraction", {},
                 marks=pytest.mark.once("t5")),
]


@pytest.mark.parametrize("model_type,task,auto_class,runtime_class,values", KIND_CASES)
def test_text_models_of_a_kind_match_pytorch(model_type, task, auto_class, runtime_class, values, tmp_path):
    """The real CLI with --no-fallback, then the task's runtime class on 4 padded texts of 7 tokens (the capture ran
    2 and 3 at other lengths) against PyTorch, real positions, 1e-4."""
    import zoo

    checkpoint, out = tmp_path / "checkpoint", tmp_path / "onnx"
    config = zoo.tiny_config(model_type, zoo.TINY_VISION)
    for name, value in values.items():
        setattr(config, name, value)
    torch.manual_seed(0)
    model = getattr(transformers, auto_class).from_config(config).eval()
    model.save_pretrained(checkpoint)
    tiny_tokenizer(min(vocab_size(model.config), 128)).save_pretrained(checkpoint)
    run = optimum_cli("export", "onnx", "--dynamo", "--no-fallback", "--model", checkpoint, "--task", task, out)
    assert run.returncode == 0, run.stderr[-3000:]
    batch = dict(AutoTokenizer.from_pretrained(checkpoint)(TEXTS, return_tensors="pt", padding=True))
    batch = {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask")}
    assert batch["input_ids"].shape == (4, 7)
    with torch.no_grad():
        expected = model(**batch)
    got = getattr(ort, runtime_class).from_pretrained(out)(**batch)
    real = batch["attention_mask"].bool()
    names = [n for n in ("start_logits", "end_logits", "last_hidden_state") if n in expected]
    assert names and all(n in got for n in names)
    for name in names:
        diff = (torch.as_tensor(got[name]) - expected[name])[real].abs().max().item()
        assert diff < ATOL, f"{name} differs by {diff:.3e}"


@pytest.mark.once("t4")
def test_a_forward_that_draws_random_numbers_is_refused_saying_so(tmp_path):
    """ViT-MAE's base model masks patches by random noise drawn in its forward: no two runs agree, so validation
    cannot but refuse the graph; the one line says why, and nothing is written."""
    import zoo

    checkpoint, out = tmp_path / "checkpoint", tmp_path / "onnx"
    torch.manual_seed(0)
    transformers.AutoModel.from_config(zoo.tiny_config("vit_mae", zoo.TINY_VISION)).save_pretrained(checkpoint)
    run = optimum_cli("export", "onnx", "--dynamo", "--no-fallback", "--model", checkpoint, "--task",
                      "feature-extraction", out)
    assert run.returncode != 0 and not out.exists()
    line = run.stderr.splitlines()[-1]
    assert line.startswith("optimum-cli export onnx --dynamo: error: dynamo export failed (GrossMismatch: output ")
    assert line.endswith("the forward draws random numbers (rand): no two runs agree, PyTorch's own included; an "
                         "explicit --atol above the difference writes it anyway); no fallback: --no-fallback")


@pytest.mark.skipif(ON_5, reason="CI's time: transformers 4.57's CPM-Ant is the measured case")
def test_an_axis_the_model_fixes_is_named(tmp_path):
    """CPM-Ant's forward turns the sequence length into a Python number (it fixes the axis torch.export was told
    varies): one line names the input, axis and size; no graph for one length is written."""
    import zoo

    checkpoint, out = tmp_path / "checkpoint", tmp_path / "onnx"
    torch.manual_seed(0)
    transformers.AutoModel.from_config(zoo.tiny_config("cpmant")).save_pretrained(checkpoint)
    run = optimum_cli("export", "onnx", "--dynamo", "--no-fallback", "--model", checkpoint, "--task",
                      "feature-extraction", out)
    assert run.returncode != 0 and not out.exists()
    assert ("optimum-cli export onnx --dynamo: error: dynamo export failed (PipelineError: the model's code fixes "
            "input_ids's sequence_length to 11 (a Python number made from a tensor's size): a graph that takes other "
            "sizes cannot be traced from it); no fallback: --no-fallback") in run.stderr.splitlines()


@pytest.mark.once("t4")  # CI: where its patch (eos_pooled_classification) is active (make test-all: both)
def test_an_encoder_decoder_classifier_exports_without_its_cache(tmp_path):
    """MT5's classifier runs its decoder stack, whose config is a copy of the model's: the capture turns the cache
    off there too (else its calls return a cache the graph does not), and ORTModelForSequenceClassification matches
    PyTorch on texts ending with the eos token, where the model pools (its tokenizer adds it; on transformers 4 by a
    data-dependent boolean index, which the `eos_pooled_classification` patch replaces)."""
    from tokenizers import processors

    checkpoint = tmp_path / "checkpoint"
    torch.manual_seed(0)
    config = tiny_config("mt5", decoder_start_token_id=0)
    torch_model = transformers.MT5ForSequenceClassification(config).eval()
    torch_model.save_pretrained(checkpoint)
    tokenizer = tiny_tokenizer(config.vocab_size)
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="$A </s>", special_tokens=[("</s>", tokenizer.eos_token_id)])
    tokenizer.save_pretrained(checkpoint)
    out = tmp_path / "onnx"
    run = optimum_cli("export", "onnx", "--dynamo", "--no-fallback", "--model", checkpoint, "--task",
                      "text-classification", out)
    assert run.returncode == 0, run.stderr[-3000:]
    inputs = AutoTokenizer.from_pretrained(checkpoint)(TEXTS, return_tensors="pt", padding=True)
    inputs = {name: inputs[name] for name in ("input_ids", "attention_mask")}  # 4.57's tokenizer adds token types
    with torch.no_grad():
        expected = torch_model(**inputs).logits
    got = ort.ORTModelForSequenceClassification.from_pretrained(out)(**inputs).logits
    diff = (torch.as_tensor(got) - expected).abs().max().item()
    assert diff < ATOL, f"logits differ by {diff:.3e}"


@pytest.mark.once("t4")
def test_from_pretrained_exports_a_classifier_with_dynamo(tmp_path):
    """`ORTModelForSequenceClassification.from_pretrained(..., export=True, dynamo=True)`: a runtime class whose
    `_from_pretrained` takes no `use_cache` (every class of a task without generation) loads what it exported."""
    checkpoint = save_tiny_model("bert", "text-classification", tmp_path / "checkpoint")
    ort_model = ort.ORTModelForSequenceClassification.from_pretrained(checkpoint, export=True, dynamo=True)
    torch_model = transformers.AutoModelForSequenceClassification.from_pretrained(checkpoint).eval()
    inputs = _inputs("bert", "text-classification", checkpoint)
    with torch.no_grad():
        expected = torch_model(**inputs).logits
    assert (torch.as_tensor(ort_model(**inputs).logits) - expected).abs().max().item() < ATOL
