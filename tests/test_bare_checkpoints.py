"""Checkpoints saved with `model.save_pretrained` only (no tokenizer or processor files, `pad_token_id` unset):
the export synthesizes its samples, writes no preprocessor file, keeps text axes dynamic, and runs in
optimum's runtime class at a batch and sequence (or image) size never seen in capture, within 1e-4 of PyTorch."""

import onnx
import pytest
import torch
from optimum.exporters.tasks import TasksManager

import optimum.onnxruntime as ort
from optimum_dynamo.exporters.base import OTHER_PREPROCESSOR_FILES, PREPROCESSOR_FILES
from optimum_dynamo.manifest import read_manifest

from conftest import BARE

ATOL = 1e-4
# Capture ran batches 2 and 3 (text lengths 5/8 for generation, 6/11 for forward tasks): batch 4, length 7 is new.
BATCH, LENGTH = 4, 7
PREPROCESSOR = {n for names in PREPROCESSOR_FILES.values() for n in names} | set(OTHER_PREPROCESSOR_FILES)


def _text(vocab, batch=BATCH, length=LENGTH):
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(3, vocab, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[1, :3] = 0  # one left-padded row
    return {"input_ids": ids, "attention_mask": mask}


def _torch_model(model_type, checkpoint):
    task = BARE[model_type][0].removesuffix("-with-past")
    return TasksManager.get_model_class_for_task(task, library="transformers").from_pretrained(checkpoint).eval()


# CI: these in one environment (make test-all: both)
ONCE = {"t5": "t5", "codegen": "t4", "roberta": "t4", "distilbert": "t5", "vit": "t5", "whisper": "t5", "bert": "t4"}


def _params(types):
    return [pytest.param(m, marks=pytest.mark.once(ONCE[m])) if m in ONCE else m for m in types]


@pytest.mark.parametrize("model_type", _params(BARE))
def test_bare_checkpoint_runs_in_runtime_class_at_unseen_sizes(model_type, bare_checkpoints, bare_exports):
    checkpoint, out = bare_checkpoints(model_type), bare_exports(model_type)
    assert not PREPROCESSOR & {p.name for p in checkpoint.iterdir()}
    assert not PREPROCESSOR & {p.name for p in out.iterdir()}, "the export wrote a preprocessor file"
    torch_model = _torch_model(model_type, checkpoint)
    ort_model = getattr(ort, BARE[model_type][1]).from_pretrained(out)
    config = torch_model.config
    if model_type == "vit":  # a fixed-size model: new batch only
        inputs = {"pixel_values": torch.randn(BATCH, 3, 32, 32, generator=torch.Generator().manual_seed(1))}
    elif model_type == "whisper":  # frames are fixed (2 x max_source_positions), the batch is new
        g = torch.Generator().manual_seed(1)
        inputs = {"input_features": torch.randn(BATCH, config.num_mel_bins, 2 * config.max_source_positions, generator=g)}
    else:
        inputs = _text(config.vocab_size)
    if BARE[model_type][0].endswith("-with-past"):
        # greedy tokens, then the logits of one forward over the generated sequence (no cache)
        options = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=0)
        with torch.no_grad():
            expected = torch_model.generate(**inputs, **options)
        got = ort_model.generate(**inputs, **options)
        assert torch.equal(got, expected)
        if model_type in ("llama", "codegen"):
            keep = torch.cat([inputs["attention_mask"], torch.ones_like(got[:, LENGTH:])], dim=1).bool()
            forward = {"input_ids": got, "attention_mask": keep.long()}
        else:
            keep = None
            forward = {**inputs, "decoder_input_ids": got}
        with torch.no_grad():
            reference = torch_model(**forward).logits
        d = (ort_model(**forward).logits - reference).abs()
        diff = (d[keep] if keep is not None else d).max().item()
    else:
        with torch.no_grad():
            expected = torch_model(**inputs)
        got = ort_model(**inputs)
        keep = inputs.get("attention_mask")
        diffs = []
        for name, value in expected.items():
            if isinstance(value, torch.Tensor) and name in got:
                d = (got[name] - value).abs()
                if keep is not None and d.dim() >= 2 and d.shape[:2] == keep.shape:  # real positions only
                    d = d[keep.bool()]
                diffs.append(d.max().item())
        assert diffs
        diff = max(diffs)
    assert diff < ATOL, f"{model_type}: differs from PyTorch by {diff:.3e}"


TEXT = [m for m in BARE if m not in ("vit", "whisper")]


@pytest.mark.parametrize("model_type", _params(TEXT))
def test_text_exports_keep_batch_and_sequence_axes_dynamic(model_type, bare_exports):
    """Every graph of a text export takes input_ids with symbolic batch and sequence axes."""
    out = bare_exports(model_type)
    graphs = sorted(out.glob("*.onnx"))
    assert graphs
    for path in graphs:
        for value in onnx.load(path, load_external_data=False).graph.input:
            if value.name in ("input_ids", "attention_mask"):
                dims = value.type.tensor_type.shape.dim
                static = [i for i, d in enumerate(dims) if not d.dim_param]
                assert static == [], f"{path.name}: {value.name} has static axes {static}"


def test_whisper_frames_recorded_static_with_reason(bare_exports):
    manifest = read_manifest(bare_exports("whisper"))
    reason = manifest["components"]["encoder_model"]["static_axes"]["input_features"]["2"]
    assert "takes exactly 64 frames" in reason and "max_source_positions" in reason
