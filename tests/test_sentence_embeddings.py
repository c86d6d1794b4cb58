"""sentence-transformers models under `--dynamo`: the real optimum-cli on a tiny model (a transformer, mean
pooling, normalization) saved by `SentenceTransformer.save`; the graph's `sentence_embedding` through
`ORTModelForCustomTasks` equals `SentenceTransformer.encode` at a batch the capture did not see."""

import pytest
import torch
import transformers
from optimum.onnxruntime import ORTModelForCustomTasks
from transformers import AutoTokenizer

from optimum_dynamo.manifest import read_manifest
from tiny import tiny_config, tiny_tokenizer

from conftest import optimum_cli

sentence_transformers = pytest.importorskip("sentence_transformers")

ATOL = 1e-4
TEXTS = ["the quick brown fox jumps over the", "hello world", "a tiny model", "optimum exports models to onnx"]
ON_5 = transformers.__version__ >= "5"


def _save_tiny_sentence_model(path):
    from sentence_transformers import SentenceTransformer, models

    torch.manual_seed(0)
    transformer_dir = path.parent / "transformer"
    transformers.BertModel(tiny_config("bert")).save_pretrained(transformer_dir)
    tiny_tokenizer(128).save_pretrained(transformer_dir)
    modules = [models.Transformer(str(transformer_dir)), models.Pooling(32, "mean"), models.Normalize()]
    SentenceTransformer(modules=modules, device="cpu").save(str(path))
    return path


# the library as optimum infers it (the checkpoint's modules.json) in one environment, the flag in the other (CI's time)
@pytest.mark.once("t4")
@pytest.mark.parametrize("flag", [[] if ON_5 else ["--library-name", "sentence_transformers"]])
def test_sentence_embedding_equals_encode(flag, tmp_path):
    checkpoint, out = _save_tiny_sentence_model(tmp_path / "model"), tmp_path / "onnx"
    run = optimum_cli("export", "onnx", "--dynamo", "--no-fallback", "--model", checkpoint, *flag, out)
    assert run.returncode == 0, run.stderr[-3000:]
    manifest = read_manifest(out)
    assert manifest["task"] == "feature-extraction"
    assert manifest["outputs"] == ["token_embeddings", "sentence_embedding"]
    batch = AutoTokenizer.from_pretrained(out)(TEXTS, padding=True, return_tensors="pt")
    # the tokenizer's own inputs (transformers 5's fast tokenizer makes no token types here)
    assert manifest["inputs"] == [n for n in ("input_ids", "attention_mask", "token_type_ids") if n in batch]

    expected = sentence_transformers.SentenceTransformer(str(checkpoint), device="cpu").encode(
        TEXTS, convert_to_tensor=True)
    got = torch.as_tensor(ORTModelForCustomTasks.from_pretrained(out)(**batch)["sentence_embedding"])
    assert got.shape == expected.shape == (4, 32)
    assert (got - expected).abs().max().item() < ATOL
    assert torch.allclose(got.norm(dim=-1), torch.ones(4), atol=1e-5)  # the Normalize module is in the graph
