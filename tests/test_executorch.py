"""ExecuTorch `.pte` export of decoder LMs: real executorch, tiny models from config.

Greedy tokens through optimum-executorch's `ExecuTorchModelForCausalLM` where it imports (transformers 5),
else through the package's runner. Lowering costs ~20 s per model: llama and gemma2 by default, the rest slow.
"""

import json

import pytest
import torch

pytest.importorskip("executorch")

from optimum_dynamo.errors import ExportError  # noqa: E402
from optimum_dynamo.exporters.executorch import PTE_FILE, export_executorch  # noqa: E402
from optimum_dynamo.manifest import MANIFEST_FILE  # noqa: E402

MAX_SEQ_LEN = 32
PROMPT = [1, 5, 9, 13, 17, 21, 25, 29, 33]  # 9 tokens: longer than the sliding windows below
NEW_TOKENS = 12
SLIDING = {"sliding_window": 6}
MODELS = {  # model type -> config overrides
    "llama": {},
    "gemma2": SLIDING,
    "qwen2": {},
    "phi3": SLIDING,
    "gpt2": {},
    "mistral": SLIDING,
}
DEFAULT = ("llama", "gemma2")


def optimum_executorch():
    """optimum-executorch's runtime class, or None where it cannot be imported (transformers 4)."""
    import transformers

    if int(transformers.__version__.split(".")[0]) < 5:
        return None
    from optimum.executorch import ExecuTorchModelForCausalLM  # T5 installs it: an import error is a failure

    return ExecuTorchModelForCausalLM


def load_runtime(out):
    runtime = optimum_executorch()
    if runtime is not None:
        return runtime.from_pretrained(str(out))
    from optimum_dynamo.runtime.executorch import PteCausalLM

    return PteCausalLM(out)


def generate(model, prompt, total: int | None):
    """New tokens from either runtime, `total` positions at most (prompt included; None: the program's limit)."""
    if optimum_executorch() is not None:
        return model.generate(list(prompt), max_seq_len=total)
    return model.generate(prompt, max_new_tokens=None if total is None else total - len(prompt))


def pytorch_greedy(checkpoint, prompt, max_length: int) -> list[int]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             do_sample=False, max_length=max_length)
    return out[0, len(prompt):].tolist()


# exported by the real `optimum-cli export executorch --dynamo` (optimum-executorch's command in T5, optimum-dynamo's
# own in T4); the others by the Python API
CLI_MODEL = "llama"


@pytest.fixture(scope="session")
def pte_exports(tmp_path_factory):
    """pte_exports("llama") -> (checkpoint, export dir), exported once per session."""
    from conftest import optimum_cli
    from tiny import save_tiny_decoder

    root = tmp_path_factory.mktemp("executorch")
    made = {}

    def get(model_type):
        if model_type not in made:
            checkpoint = save_tiny_decoder(model_type, root / f"{model_type}-checkpoint", **MODELS[model_type])
            out = root / f"{model_type}-pte"
            if model_type == CLI_MODEL:
                run = optimum_cli("export", "executorch", "--dynamo", "--model", checkpoint, "--output_dir", out,
                                  "--max_seq_len", MAX_SEQ_LEN, "--atol", "1e-4")
                assert run.returncode == 0, run.stderr[-3000:]
            else:
                export_executorch(str(checkpoint), out, max_seq_len=MAX_SEQ_LEN, atol=1e-4)
            made[model_type] = checkpoint, out
        return made[model_type]

    return get


def params(models):
    """DEFAULT in CI (gemma2's sliding layers in one environment: make test-all runs it in both), the rest slow."""
    return [pytest.param(m, marks=pytest.mark.once("t5")) if m == "gemma2" else m if m in DEFAULT
            else pytest.param(m, marks=pytest.mark.slow) for m in models]


@pytest.mark.parametrize("model_type", params(MODELS))
def test_greedy_tokens_equal_pytorch(pte_exports, model_type):
    checkpoint, out = pte_exports(model_type)
    expected = pytorch_greedy(checkpoint, PROMPT, len(PROMPT) + NEW_TOKENS)
    assert generate(load_runtime(out), PROMPT, len(PROMPT) + NEW_TOKENS) == expected


@pytest.mark.parametrize("model_type", params(MODELS))
def test_prefill_runs_in_one_call(pte_exports, model_type):
    """A 9-token prompt (longer than the sliding window) in one `forward` call: PyTorch's logits (1e-4)."""
    from executorch.runtime import Runtime
    from transformers import AutoModelForCausalLM

    checkpoint, out = pte_exports(model_type)
    program = Runtime.get().load_program(str(out / PTE_FILE))
    assert program.metadata("forward").input_tensor_meta(1).sizes()[0] == MAX_SEQ_LEN  # dynamic seq, upper bound
    logits = program.load_method("forward").execute([torch.tensor([PROMPT]), torch.arange(len(PROMPT))])[0]
    model = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    with torch.no_grad():
        expected = model(torch.tensor([PROMPT])).logits
    assert logits.shape == expected.shape
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("model_type", params(MODELS))
def test_sliding_layers_hold_the_window(pte_exports, model_type):
    """The cache buffers inside the program: the window (6) on sliding layers, max_seq_len on the others."""
    from transformers import AutoConfig

    checkpoint, out = pte_exports(model_type)
    config = AutoConfig.from_pretrained(checkpoint)
    kinds = getattr(config, "layer_types", None) or ["sliding_attention" if MODELS[model_type] else "full_attention"] * 2
    expected = [6 if kind == "sliding_attention" else MAX_SEQ_LEN for kind in kinds]
    assert json.loads((out / MANIFEST_FILE).read_text())["cache_lengths"] == expected
    assert {"gemma2": [6, MAX_SEQ_LEN], "llama": [MAX_SEQ_LEN] * 2}.get(model_type, expected) == expected


@pytest.mark.parametrize("model_type", params(["llama", "gemma2"]))
def test_generation_stops_at_max_seq_len(pte_exports, model_type):
    from executorch.runtime import Runtime

    checkpoint, out = pte_exports(model_type)
    program = Runtime.get().load_program(str(out / PTE_FILE))
    assert program.load_method("get_max_seq_len").execute([])[0] == MAX_SEQ_LEN
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    assert manifest["backend"] == "executorch" and manifest["max_seq_len"] == MAX_SEQ_LEN
    assert manifest["inputs"] == ["input_ids", "cache_position"] and manifest["outputs"] == ["logits"]
    expected = pytorch_greedy(checkpoint, PROMPT, MAX_SEQ_LEN)
    model = load_runtime(out)
    tokens = generate(model, PROMPT, None)  # up to the program's limit
    assert tokens == expected
    assert len(PROMPT) + len(tokens) == MAX_SEQ_LEN or tokens[-1] == 2
    if optimum_executorch() is not None:  # asking for more is truncated to the limit, no error
        assert generate(model, PROMPT, 2 * MAX_SEQ_LEN) == expected


def test_export_files_and_metadata(pte_exports):
    from executorch.runtime import Runtime

    _, out = pte_exports("llama")
    names = {p.name for p in out.iterdir()}
    assert {PTE_FILE, "config.json", "generation_config.json", "tokenizer.json", MANIFEST_FILE} <= names
    program = Runtime.get().load_program(str(out / PTE_FILE))
    value = lambda name: program.load_method(name).execute([])  # noqa: E731
    assert value("get_vocab_size")[0] == 128 and value("get_max_batch_size")[0] == 1
    assert list(value("get_eos_ids")) == [2] and value("get_bos_id")[0] == 1
    assert value("use_kv_cache")[0] is True


@pytest.mark.once("t5")
def test_atol_violation_writes_nothing(pte_exports, tmp_path):
    checkpoint, _ = pte_exports("llama")
    out = tmp_path / "out"
    with pytest.raises(ExportError) as err:
        export_executorch(str(checkpoint), out, max_seq_len=MAX_SEQ_LEN, atol=1e-30)
    message = str(err.value)
    assert "\n" not in message and message.startswith("output 'logits' differs from PyTorch by ")
    assert message.split(" > atol ")[1].startswith("1e-30")
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("value", [0, 2, "64", True])
def test_bad_max_seq_len_is_one_line(tmp_path, value):
    with pytest.raises(ExportError, match=r"^invalid --max_seq_len .*: expected an integer >= 4$"):
        export_executorch(str(tmp_path), tmp_path / "out", max_seq_len=value)
    assert not (tmp_path / "out").exists()


def test_model_without_kv_cache_is_one_line(tmp_path):
    """A state-space model has no attention cache to make static: one error line, no output directory."""
    from optimum_dynamo.errors import PipelineError
    from tiny import save_tiny_decoder

    checkpoint = save_tiny_decoder("mamba", tmp_path / "mamba")
    with pytest.raises(PipelineError) as err:
        export_executorch(str(checkpoint), tmp_path / "out", max_seq_len=MAX_SEQ_LEN)
    assert str(err.value).startswith("mamba: ") and "\n" not in str(err.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("options, message", [
    ({"optimize_level": "O2"}, "ExecuTorch export: unsupported option(s) optimize_level"),
    ({"dtype": "fp16"}, "ExecuTorch export: dtype 'fp16' is not supported yet (fp32 only)"),
])
def test_options_not_honoured_are_refused(tmp_path, options, message):
    with pytest.raises(ExportError) as err:
        export_executorch(str(tmp_path), tmp_path / "out", **options)
    assert str(err.value) == message and not (tmp_path / "out").exists()


def test_cli_export_executorch_dynamo(pte_exports):
    """The real `optimum-cli export executorch --dynamo` made llama's program (its greedy tokens and metadata: the
    tests above): the options it was given are in the manifest, the model's files beside the program."""
    checkpoint, out = pte_exports(CLI_MODEL)
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    assert (manifest["backend"], manifest["max_seq_len"]) == ("executorch", MAX_SEQ_LEN)
    assert max(row["max_abs"] for row in manifest["discrepancies"]) < 1e-4
    assert (out / "config.json").read_text() == (checkpoint / "config.json").read_text()
