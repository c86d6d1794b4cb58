"""Load order (issue 9): building an ORTModel* before the PyTorch model must leave the PyTorch model's
outputs unchanged. Per model, two fresh interpreters load the same tiny checkpoint: one builds the
ORTModel from the `--dynamo` export first (and runs it once), the other never imports optimum.onnxruntime.
The PyTorch logits, greedy tokens and scores of both must be exactly equal (rtol = atol = 0)."""

import subprocess
import sys

import pytest
import torch

import tiny

from conftest import optimum_cli
from test_decoder_sweep import DEFAULT, SLIDING, WINDOW

# name -> (runtime class, export task, PyTorch class, checkpoint writer)
MODELS = {
    "bart": ("ORTModelForSeq2SeqLM", "text2text-generation-with-past", "AutoModelForSeq2SeqLM",
             lambda path: tiny.save_tiny_model("bart", "text2text-generation", path)),
    "t5": ("ORTModelForSeq2SeqLM", "text2text-generation-with-past", "AutoModelForSeq2SeqLM",
           lambda path: tiny.save_tiny_model("t5", "text2text-generation", path)),
    "whisper": ("ORTModelForSpeechSeq2Seq", "automatic-speech-recognition-with-past", "AutoModelForSpeechSeq2Seq",
                tiny.save_tiny_speech_seq2seq),
    "vision-encoder-decoder": ("ORTModelForVision2Seq", "image-to-text-with-past", "VisionEncoderDecoderModel",
                               tiny.save_tiny_vision_seq2seq),
    "bert": ("ORTModelForSequenceClassification", "text-classification", "AutoModelForSequenceClassification",
             lambda path: tiny.save_tiny_model("bert", "text-classification", path)),
    **{
        model_type: ("ORTModelForCausalLM", "text-generation-with-past", "AutoModelForCausalLM",
                     lambda path, m=model_type: tiny.save_tiny_decoder(
                         m, path, **({"sliding_window": WINDOW} if m in SLIDING else {})))
        for model_type in sorted(DEFAULT)
    },
}
# The default run: one decoder of the sweep's default subset; the rest (seq2seq, Whisper included) is slow.
FAST = {"qwen3"}

# Runs in a fresh interpreter of this environment (the start-up hook applies the bridge, as for users).
PROBE = r"""
import sys
import numpy as np, torch, transformers
runtime_class, torch_class, ckpt, onnx_dir, out = sys.argv[1:6]
PROMPTS = ["hello world", "the quick brown fox jumps over the lazy dog"]
if runtime_class == "ORTModelForSpeechSeq2Seq":
    t = np.arange(12000) / 16000
    waves = [np.sin(2 * np.pi * f * t).astype(np.float32) for f in (300, 500)]
    extractor = transformers.AutoFeatureExtractor.from_pretrained(ckpt)
    inputs = {"input_features": extractor(waves, sampling_rate=16000, return_tensors="pt")["input_features"]}
elif runtime_class == "ORTModelForVision2Seq":
    rng = np.random.default_rng(1)
    images = [rng.integers(0, 256, (30, 40, 3), dtype=np.uint8) for _ in range(2)]
    processor = transformers.AutoImageProcessor.from_pretrained(ckpt)
    inputs = {"pixel_values": processor(images=images, return_tensors="pt")["pixel_values"]}
else:
    tokenizer = transformers.AutoTokenizer.from_pretrained(ckpt)
    tokenizer.padding_side = "left" if runtime_class == "ORTModelForCausalLM" else "right"
    batch = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask")}
generative = runtime_class != "ORTModelForSequenceClassification"
greedy = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=0)
# Whisper's generate on transformers 5 cannot post-process optimum's tuple caches with return_dict_in_generate
scored = dict(greedy, output_scores=True, return_dict_in_generate=True)
if onnx_dir != "-":
    import optimum.onnxruntime

    ort_model = getattr(optimum.onnxruntime, runtime_class).from_pretrained(onnx_dir)
    if not generative:
        ort_model(**inputs)
    else:
        ort_model.generate(**inputs, **(greedy if runtime_class == "ORTModelForSpeechSeq2Seq" else scored))
model = getattr(transformers, torch_class).from_pretrained(ckpt).eval()
result = {"class": type(model).__name__, "attention": model.config._attn_implementation}
with torch.no_grad():
    if not generative:
        result["logits"] = model(**inputs).logits
    elif runtime_class == "ORTModelForCausalLM":
        result["logits"] = model(**inputs).logits
        run = model.generate(**inputs, **scored)
        result["tokens"], result["scores"] = run.sequences, torch.stack(run.scores)
    elif runtime_class == "ORTModelForSpeechSeq2Seq":
        result["tokens"] = model.generate(**inputs, **greedy)
        result["logits"] = model(**inputs, decoder_input_ids=result["tokens"]).logits
    else:
        run = model.generate(**inputs, **scored)
        result["tokens"], result["scores"] = run.sequences, torch.stack(run.scores)
        result["logits"] = model(**inputs, decoder_input_ids=run.sequences).logits
if onnx_dir == "-" and "optimum.onnxruntime" in sys.modules:
    raise SystemExit("the reference process imported optimum.onnxruntime")
torch.save(result, out)
"""


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(checkpoint, --dynamo export) per model name, made once per module."""
    root, made = tmp_path_factory.mktemp("load-order"), {}

    def get(name):
        if name not in made:
            _, task, _, write = MODELS[name]
            ckpt, out = write(root / f"ckpt-{name}"), root / f"onnx-{name}"
            run = optimum_cli("export", "onnx", "--dynamo", "--model", ckpt, "--task", task, out)
            assert run.returncode == 0, run.stderr[-3000:]
            made[name] = ckpt, out
        return made[name]

    return get


def _pytorch_outputs(name, ckpt, onnx_dir, out):
    runtime_class, _, torch_class, _ = MODELS[name]
    run = subprocess.run([sys.executable, "-c", PROBE, runtime_class, torch_class, str(ckpt), str(onnx_dir), str(out)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return torch.load(out)


@pytest.mark.once("t4")
@pytest.mark.parametrize("name", [n if n in FAST else pytest.param(n, marks=pytest.mark.slow) for n in MODELS])
def test_ort_model_first_leaves_pytorch_outputs_unchanged(name, exported, tmp_path):
    ckpt, onnx_dir = exported(name)
    reference = _pytorch_outputs(name, ckpt, "-", tmp_path / "reference.pt")
    after_ort = _pytorch_outputs(name, ckpt, onnx_dir, tmp_path / "after-ort.pt")
    assert after_ort.keys() == reference.keys()
    for key, expected in reference.items():
        if isinstance(expected, torch.Tensor):
            torch.testing.assert_close(after_ort[key], expected, rtol=0, atol=0, msg=lambda m, key=key: f"{key}: {m}")
        else:
            assert after_ort[key] == expected, key
