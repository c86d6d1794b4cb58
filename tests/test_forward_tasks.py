"""`--dynamo` for non-generative tasks: CLI export, the matching ORTModel class, parity with PyTorch
at a batch size and sequence length (or image size) not seen during capture."""

import pytest
import torch
from optimum.exporters.tasks import TasksManager
from transformers import AutoTokenizer, ViTImageProcessor

import optimum.onnxruntime as ort
from optimum_dynamo.manifest import read_manifest
from tiny import save_tiny_model

from conftest import optimum_cli

ATOL = 1e-4
CASES = [
    ("bert", "fill-mask", "ORTModelForMaskedLM"),
    ("bert", "feature-extraction", "ORTModelForFeatureExtraction"),
    ("roberta", "token-classification", "ORTModelForTokenClassification"),
    ("distilbert", "question-answering", "ORTModelForQuestionAnswering"),
    ("deberta-v2", "text-classification", "ORTModelForSequenceClassification"),
    ("electra", "multiple-choice", "ORTModelForMultipleChoice"),
    ("vit", "image-classification", "ORTModelForImageClassification"),
    ("convnext", "image-classification", "ORTModelForImageClassification"),
    ("resnet", "image-classification", "ORTModelForImageClassification"),
]
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
