"""The smoke set: what a user of the installed wheel runs, in processes that never import optimum_dynamo.

Tiny checkpoints come from the source tree's `tests/tiny.py`, loaded by path as a plain module (the smoke set
runs from its own directory).
"""

import importlib.metadata
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SOURCE = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("tiny_checkpoints", SOURCE / "tests" / "tiny.py")
tiny = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tiny)


PROMPTS = ["hello world", "the quick brown fox jumps over the lazy dog"]


def greedy(model, inputs, new_tokens=8):
    return model.generate(**inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)


def padded(tokenizer):
    """The two prompts as one left-padded batch (input_ids, attention_mask)."""
    tokenizer.padding_side = "left"
    batch = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    assert (batch["attention_mask"] == 0).any(), "the batch must have a left-padded row"
    return {k: batch[k] for k in ("input_ids", "attention_mask")}


def transformers_major() -> int:
    return int(importlib.metadata.version("transformers").split(".")[0])


def onnx_defines_dynamo() -> bool:
    """Whether the installed optimum-onnx's own `export onnx` command has a `--dynamo` option (its main branch
    after 0.1.0 does), read from its source file without importing anything."""
    source = importlib.metadata.distribution("optimum-onnx").locate_file("optimum/commands/export/onnx.py")
    return '"--dynamo"' in Path(source).read_text()


def run(*argv, env=None) -> subprocess.CompletedProcess:
    """A command of this environment (`optimum-cli`, `python`) in a fresh process."""
    exe = argv[0] if argv[0] != "python" else sys.executable
    exe = exe if os.path.isabs(exe) else str(Path(sys.executable).parent / exe)
    return subprocess.run([exe, *map(str, argv[1:])], capture_output=True, text=True, timeout=900,
                          env=None if env is None else {**os.environ, **env})


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    root, built = tmp_path_factory.mktemp("checkpoints"), {}

    def get(model_type: str, task: str = "text-generation") -> Path:
        if (model_type, task) not in built:
            path = root / f"{model_type}-{task}"
            if task == "text-generation":
                tiny.save_tiny_decoder(model_type, path)
            else:
                tiny.save_tiny_model(model_type, task, path)
            built[model_type, task] = path
        return built[model_type, task]

    return get
