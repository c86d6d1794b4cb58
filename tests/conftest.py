import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", help="run slow sweeps too")


# this environment, as `once` names it: transformers 4 ("t4") or 5 ("t5")
ENVIRONMENT = "t5" if int(version("transformers").split(".")[0]) >= 5 else "t4"


def pytest_collection_modifyitems(config, items):
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow (make test-all)")
    for item in items:
        once = item.get_closest_marker("once")
        if "slow" in item.keywords:
            item.add_marker(skip)
        elif once is not None and once.args[0] != ENVIRONMENT:
            item.add_marker(pytest.mark.skip(reason=f"once: runs in {once.args[0]}, here with --runslow (make test-all)"))


def memoized(make):
    """make(key) once per key: get(key) -> its result."""
    made = {}

    def get(key):
        if key not in made:
            made[key] = make(key)
        return made[key]

    return get


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    """Tiny decoder checkpoints, built once per session: checkpoints("llama") -> path."""
    from tiny import save_tiny_decoder

    root = tmp_path_factory.mktemp("checkpoints")
    return memoized(lambda model_type: save_tiny_decoder(model_type, root / model_type))


def optimum_cli(*args: str) -> subprocess.CompletedProcess:
    """Run the real `optimum-cli` of this environment."""
    exe = Path(sys.executable).parent / "optimum-cli"
    return subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, timeout=900)


def cli_export(out: Path, *args) -> Path:
    """`optimum-cli export onnx --dynamo ARGS OUT`, asserted to succeed."""
    run = optimum_cli("export", "onnx", "--dynamo", *args, out)
    assert run.returncode == 0, run.stderr[-3000:]
    return out


@pytest.fixture(scope="session")
def dynamo_exports(checkpoints, tmp_path_factory):
    """`optimum-cli export onnx --dynamo` outputs, made once per session: dynamo_exports("llama") -> dir."""
    root = tmp_path_factory.mktemp("dynamo")
    return memoized(lambda model_type: cli_export(root / model_type, "--model", checkpoints(model_type),
                                                  "--task", "text-generation-with-past"))


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
    from tiny import save_tiny_model

    root = tmp_path_factory.mktemp("bare")
    return memoized(lambda model_type: save_tiny_model(
        model_type, BARE[model_type][0].removesuffix("-with-past"), root / model_type, bare=True))


@pytest.fixture(scope="session")
def bare_exports(bare_checkpoints, tmp_path_factory):
    """`optimum-cli export onnx --dynamo` of a bare checkpoint, made once per session."""
    root = tmp_path_factory.mktemp("bare-onnx")
    return memoized(lambda model_type: cli_export(root / model_type, "--no-fallback", "--model",
                                                  bare_checkpoints(model_type), "--task", BARE[model_type][0]))


# image-text-to-text families exported by the real `optimum-cli export onnx --dynamo` (task inferred from the
# checkpoint) in vlm_models; the others by from_pretrained(export=True, dynamo=True) (gemma3, llava: both, test_vlm_cli)
CLI_VLMS = {"idefics3", "paligemma"}


@pytest.fixture(scope="session")
def vlm_models(tmp_path_factory):
    """A tiny image-text-to-text checkpoint (with its processor files) exported as users do, once per session and
    shared by the VLM test files: from Python, `ORTModelForImageTextToText.from_pretrained(checkpoint, export=True,
    dynamo=True)`, or for CLI_VLMS with `optimum-cli` in a child process and loaded from its output.
    vlm_models("llava") -> (checkpoint dir, the runtime model; its `model_save_dir` holds the export)."""
    from tiny import save_tiny_vlm

    from optimum_dynamo import ORTModelForImageTextToText

    def make(model_type):
        root = tmp_path_factory.mktemp(f"vlm-{model_type}")
        path = save_tiny_vlm(model_type, root / "model")
        if model_type in CLI_VLMS:
            return path, ORTModelForImageTextToText.from_pretrained(cli_export(root / "onnx", "--model", path))
        return path, ORTModelForImageTextToText.from_pretrained(path, export=True, dynamo=True)

    return memoized(make)


@pytest.fixture(scope="session")
def vlm_exports(tmp_path_factory):
    """`export_vlm` of a tiny image-text-to-text checkpoint (atol 1e-4) with the processor the tests build, for the
    families whose processor cannot be loaded here (a video part needing torchvision), once per session and shared
    by the VLM test files: vlm_exports("qwen2_vl") -> (checkpoint dir, VlmExport)."""
    from tiny import save_tiny_vlm, tiny_vlm_processor

    from optimum_dynamo import export_vlm

    def make(model_type):
        root = tmp_path_factory.mktemp(f"vlm-{model_type}")
        path = save_tiny_vlm(model_type, root / "model")
        return path, export_vlm(path, root / "onnx", processor=tiny_vlm_processor(path, model_type), atol=1e-4)

    return memoized(make)
