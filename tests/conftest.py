import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", help="run slow sweeps too")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow (make test-all)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    """Tiny decoder checkpoints, built once per session: checkpoints("llama") -> path."""
    from optimum_dynamo.tiny import save_tiny_decoder

    root, built = tmp_path_factory.mktemp("checkpoints"), {}

    def get(model_type: str) -> Path:
        if model_type not in built:
            built[model_type] = save_tiny_decoder(model_type, root / model_type)
        return built[model_type]

    return get


def optimum_cli(*args: str) -> subprocess.CompletedProcess:
    """Run the real `optimum-cli` of this environment."""
    exe = Path(sys.executable).parent / "optimum-cli"
    return subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="session")
def dynamo_exports(checkpoints, tmp_path_factory):
    """`optimum-cli export onnx --dynamo` outputs, made once per session: dynamo_exports("llama") -> dir."""
    root, made = tmp_path_factory.mktemp("dynamo"), {}

    def get(model_type: str) -> Path:
        if model_type not in made:
            out = root / model_type
            run = optimum_cli("export", "onnx", "--dynamo", "--model", checkpoints(model_type),
                              "--task", "text-generation-with-past", out)
            assert run.returncode == 0, run.stderr[-3000:]
            made[model_type] = out
        return made[model_type]

    return get


# Checkpoints as many users have them: `model.save_pretrained` only (no tokenizer or processor files),
# `pad_token_id` unset. model type -> (task exported, optimum runtime class).
BARE = {
    "bert": ("fill-mask", "ORTModelForMaskedLM"),
    "roberta": ("token-classification", "ORTModelForTokenClassification"),
    "distilbert": ("question-answering", "ORTModelForQuestionAnswering"),
    "vit": ("image-classification", "ORTModelForImageClassification"),
    "whisper": ("automatic-speech-recognition-with-past", "ORTModelForSpeechSeq2Seq"),
    "t5": ("text2text-generation-with-past", "ORTModelForSeq2SeqLM"),
    "llama": ("text-generation-with-past", "ORTModelForCausalLM"),
    "codegen": ("text-generation-with-past", "ORTModelForCausalLM"),
}


@pytest.fixture(scope="session")
def bare_checkpoints(tmp_path_factory):
    """bare_checkpoints("bert") -> a checkpoint dir without preprocessor files and pad_token_id."""
    from optimum_dynamo.tiny import save_tiny_model

    root, built = tmp_path_factory.mktemp("bare"), {}

    def get(model_type: str) -> Path:
        if model_type not in built:
            task = BARE[model_type][0].removesuffix("-with-past")
            built[model_type] = save_tiny_model(model_type, task, root / model_type, bare=True)
        return built[model_type]

    return get


@pytest.fixture(scope="session")
def bare_exports(bare_checkpoints, tmp_path_factory):
    """`optimum-cli export onnx --dynamo` of a bare checkpoint, made once per session."""
    root, made = tmp_path_factory.mktemp("bare-onnx"), {}

    def get(model_type: str) -> Path:
        if model_type not in made:
            out = root / model_type
            run = optimum_cli("export", "onnx", "--dynamo", "--no-fallback", "--model", bare_checkpoints(model_type),
                              "--task", BARE[model_type][0], out)
            assert run.returncode == 0, run.stderr[-3000:]
            made[model_type] = out
        return made[model_type]

    return get
