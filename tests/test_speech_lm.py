"""Speech LLMs (an audio tower feeding a decoder) through `optimum-cli export onnx --dynamo --task
automatic-speech-recognition`: the audio, embedding and decoder graphs, loaded by optimum's own
`ORTModelForSpeechSeq2Seq` (as users load Whisper); `generate` on a batch of two clips of other lengths than the
export's gives PyTorch's tokens and every step's logits."""

import json

import numpy as np
import pytest
import torch
import transformers
from transformers import AutoModelForSeq2SeqLM, AutoProcessor
from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

from conftest import optimum_cli
from tiny import save_tiny_speech_lm

TASK = "automatic-speech-recognition"
ATOL = 1e-4
PROGRAM = "optimum-cli export onnx --dynamo: error: "
# transformers 5 only (Qwen3-ASR: 5.24; transformers 4's Voxtral and Granite Speech are refused in one line);
# AudioFlamingo 3 (a Whisper-style tower, frames fixed at its window) and Granite Speech Plus (Granite Speech under
# other names) under `slow`
MODELS = ["glmasr", "qwen3_asr", "voxtral", "granite_speech", pytest.param("audioflamingo3", marks=pytest.mark.slow),
          pytest.param("granite_speech_plus", marks=pytest.mark.slow)]
# Voxtral: a clip over its 30-s chunk (two chunks: the audio graph's rows in order across clips); Granite Speech:
# 40 frames, two whole contexts of its conformer (the export's clips leave a remainder), beside 70
SECONDS = {"voxtral": (31.0, 1.4), "granite_speech": (0.8, 1.4), "granite_speech_plus": (0.8, 1.4)}
# the processor's own padding (the feature extractor's window), then, where the tower takes any number of frames, the
# clips' longest
PADDINGS = {"glmasr": ({}, {"padding": True})}
GREEDY = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False, return_dict_in_generate=True, output_logits=True)


def _clips(*seconds, seed=3):
    rng = np.random.default_rng(seed)
    return [(0.1 * rng.standard_normal(int(16000 * s))).astype(np.float32) for s in seconds]


def _batch(processor, model_id, clips, prompts, **padding):
    """The batch users make: the audio placeholder before each prompt; Voxtral's processor takes clips through its
    transcription request only (a language and none: prompts of two lengths)."""
    if type(processor).__name__ == "VoxtralProcessor":
        return processor.apply_transcription_request(audio=clips, model_id=str(model_id), sampling_rate=16000,
                                                     language=["en", None][: len(clips)], format="wav", **padding)
    text = [f"{processor.audio_token} {p}" for p in prompts]
    return processor(text=text, audio=clips, sampling_rate=16000, return_tensors="pt", **padding)


def _skip_unless_exported(model_type):
    if model_type not in CONFIG_MAPPING_NAMES:
        pytest.skip(f"{model_type} is not in this transformers")
    if model_type == "voxtral" and transformers.__version__ < "5":
        pytest.skip("transformers 4's Voxtral has no get_audio_features: refused in one line")
    if model_type.startswith("granite_speech") and transformers.__version__ < "5":
        pytest.skip("transformers 4's Granite Speech has no inner model: refused in one line")


@pytest.mark.parametrize("model_type", MODELS)
def test_components_load_in_ort_speech_seq2seq_and_generate_like_pytorch(model_type, tmp_path):
    from optimum.onnxruntime import ORTModelForSpeechSeq2Seq

    _skip_unless_exported(model_type)
    ckpt = save_tiny_speech_lm(model_type, tmp_path / "ckpt")
    out = tmp_path / "onnx"
    run = optimum_cli("export", "onnx", "--dynamo", "--model", ckpt, "--task", TASK, out)  # as users type it
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads((out / "speech_lm.json").read_text())["components"] == {
        name: f"{name}/model.onnx" for name in ("audio_features", "embed_tokens", "decoder_model")}

    model = ORTModelForSpeechSeq2Seq.from_pretrained(out)
    assert type(model).__name__ == "ORTModelForSpeechLM"
    processor = AutoProcessor.from_pretrained(out)
    reference = AutoModelForSeq2SeqLM.from_pretrained(ckpt).eval()
    for padding in PADDINGS.get(model_type, ({},)):
        batch = _batch(processor, ckpt, _clips(*SECONDS.get(model_type, (0.8, 1.4))),
                       ["hello there", "the quick brown fox jumps"], **padding)
        assert batch["attention_mask"][:, 0].min() == 0  # left-padded prompts
        with torch.no_grad():
            expected = reference.generate(**batch, **GREEDY)
        got = model.generate(**batch, **GREEDY)
        assert torch.equal(got.sequences, expected.sequences), padding
        diff = max((a - b).abs().max().item() for a, b in zip(got.logits, expected.logits))
        assert diff < ATOL, f"logits differ by {diff:.3e} ({padding})"

    bare = tmp_path / "bare"  # the same checkpoint without its processor files
    bare.mkdir()
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        (bare / name).write_bytes((ckpt / name).read_bytes())
    run = optimum_cli("export", "onnx", "--dynamo", "--model", bare, "--task", TASK, tmp_path / "none")
    assert run.returncode != 0 and not (tmp_path / "none").exists()
    assert [line for line in run.stderr.splitlines() if "error" in line.lower()] == [
        f"{PROGRAM}cannot load the processor of {bare} (OSError): speech LLM exports run the model on clips and a "
        "prompt, which need the checkpoint's processor files (tokenizer and feature extractor)"]


@pytest.mark.slow
@pytest.mark.parametrize("model_type", MODELS)
def test_from_pretrained_export_and_save_round_trip(model_type, tmp_path):
    from optimum.onnxruntime import ORTModelForSpeechSeq2Seq

    _skip_unless_exported(model_type)
    ckpt = save_tiny_speech_lm(model_type, tmp_path / "ckpt")
    model = ORTModelForSpeechSeq2Seq.from_pretrained(ckpt, export=True, dynamo=True)
    model.save_pretrained(tmp_path / "saved")
    again = ORTModelForSpeechSeq2Seq.from_pretrained(tmp_path / "saved")
    processor = AutoProcessor.from_pretrained(ckpt)
    batch = _batch(processor, ckpt, _clips(1.1), ["hello"])
    first, second = (m.generate(**batch, **GREEDY) for m in (model, again))
    assert type(again).__name__ == "ORTModelForSpeechLM" and torch.equal(first.sequences, second.sequences)
