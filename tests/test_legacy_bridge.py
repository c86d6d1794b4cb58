"""legacy_bridge on the installed transformers (4.x or 5.x): shims, imports, and ORT generate end to end.

Real libraries, tiny random models built locally; the Hub is never contacted.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import shutil
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import legacy_bridge  # noqa: E402  (installed at start-up already: the package's .pth hook)
import pytest  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from packaging.version import Version  # noqa: E402

from legacy_bridge import cache_argument, ort_runtime, transformers5  # noqa: E402

TRANSFORMERS = Version(transformers.__version__)


def _resolve(shim):
    if shim.trigger:
        importlib.import_module(shim.trigger)
    owner = importlib.import_module(shim.module)
    *path, name = shim.attr.split(".")
    for part in path:
        owner = getattr(owner, part)
    return getattr(owner, name, None)


def _origin(value) -> str:
    return getattr(value, "__module__", None) or type(value).__module__


def _check_generation_parameters(fn):
    from transformers import LlamaConfig

    assert fn(LlamaConfig()) == {}


def _check_legacy_cache(_):
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache

    k, v = torch.randn(2, 2, 3, 4), torch.randn(2, 2, 3, 4)
    legacy = ((k, v), (k + 1, v + 1))
    for layer, (a, b) in zip(DynamicCache.from_legacy_cache(legacy).to_legacy_cache(), legacy):
        assert torch.equal(layer[0], a) and torch.equal(layer[1], b)
    both = tuple(layer + layer for layer in legacy)  # self k, v, cross k, v
    back = EncoderDecoderCache.from_legacy_cache(both).to_legacy_cache()
    assert len(back) == 2 and all(torch.equal(x, y) for got, want in zip(back, both) for x, y in zip(got, want))


def _check_registry(registry):
    from transformers import LlamaConfig, LlamaModel

    LlamaModel(LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                           num_key_value_heads=1, vocab_size=32))
    assert registry.get(str(LlamaModel)) == LlamaModel._can_record_outputs


def _check_layer_update(update):
    from transformers.cache_utils import DynamicLayer

    keys = torch.randn(1, 2, 3, 4)
    passed = {"kwargs": {}} if TRANSFORMERS >= Version("5.24") else {}  # as the installed cache calls its layers
    got, _ = update(DynamicLayer(), keys, keys + 1, **passed)
    return torch.equal(got, keys)


USAGE = {
    "get_parameter_dtype": lambda fn: fn(torch.nn.Linear(2, 2)) == torch.float32
    and fn(torch.nn.Embedding(2, 2).to(torch.float16)) == torch.float16,
    "is_offline_mode": lambda fn: fn() is True,  # HF_HUB_OFFLINE=1
    "_CAN_RECORD_REGISTRY": _check_registry,
    "OutputRecorder": lambda cls: cls(torch.nn.Linear, index=1).index == 1,
    "PretrainedConfig._get_non_default_generation_parameters": _check_generation_parameters,
    "ORTModelForCausalLM.is_remote_code": lambda fn: fn() is False,
    "ORTModelForCausalLM.get_experts_implementation": lambda fn: fn(None) == {},
    "DynamicCache.from_legacy_cache": _check_legacy_cache,
    "DynamicCache.to_legacy_cache": _check_legacy_cache,
    "EncoderDecoderCache.from_legacy_cache": _check_legacy_cache,
    "EncoderDecoderCache.to_legacy_cache": _check_legacy_cache,
    "AutoModelForVision2Seq": lambda cls: cls.__name__ in ("AutoModelForVision2Seq", "AutoModelForImageTextToText"),
    "ORTModelForConditionalGeneration.is_remote_code": lambda fn: fn() is False,
    "ORTModelForConditionalGeneration.get_experts_implementation": lambda fn: fn(None) == {},
    "patched_dynamic_layer_update": _check_layer_update,
    "sdpa_mask_without_vmap": callable,
    "eager_mask_without_vmap": callable,
}


@pytest.mark.parametrize("shim", transformers5.SHIMS, ids=lambda s: s.attr)
def test_shim(shim):
    if shim.attr == "AutoModelForVision2Seq":
        # transformers 5 replaces its lazy module object in sys.modules after a model is built, so the name
        # is checked where optimum reads it: the module that imported it.
        from optimum.onnxruntime import modeling_seq2seq

        assert modeling_seq2seq.AutoModelForVision2Seq.__name__ in ("AutoModelForVision2Seq", "AutoModelForImageTextToText")
        return
    value = _resolve(shim)
    needed = TRANSFORMERS >= Version(shim.since)
    if needed:
        assert value is not None, f"{shim.attr} missing after install()"
        assert shim in transformers5.applied or _origin(value) != "legacy_bridge.transformers5"
        if shim.replace:
            assert shim in transformers5.applied
    else:  # transformers 4: the entry is a no-op, whatever exists is the library's own
        assert shim not in transformers5.applied
        if value is not None:
            assert not _origin(value).startswith("legacy_bridge")
    check = USAGE.get(shim.attr)
    if value is not None and check is not None:
        assert check(value) is not False


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=1, vocab_size=32)).eval()


def test_cache_argument_is_the_installed_keyword():
    from transformers import LlamaForCausalLM, MambaForCausalLM

    expected = "cache" if TRANSFORMERS >= Version("5.24") else "past_key_values"
    assert cache_argument.name() == expected
    assert cache_argument.parameter(inspect.signature(LlamaForCausalLM.forward).parameters) == expected
    mamba = cache_argument.parameter(inspect.signature(MambaForCausalLM.forward).parameters)
    assert mamba == cache_argument.renamed("cache_params") == ("cache" if expected == "cache" else "cache_params")


def test_spelled_before_takes_and_returns_past_key_values():
    """The forward optimum-onnx's torchscript export sees: `past_key_values` in and out, the model's numbers."""
    model = _tiny_llama()
    spelled = cache_argument.spelled_before(model.forward)
    params = inspect.signature(spelled).parameters
    assert "past_key_values" in params and "cache" not in params
    ids = torch.tensor([[3, 4, 5]])
    with torch.no_grad():
        first = spelled(input_ids=ids, use_cache=True)
        assert "past_key_values" in first.keys() and "cache" not in first.keys()
        got = spelled(input_ids=ids[:, :1], past_key_values=first["past_key_values"], use_cache=True)["logits"]
        cache = cache_argument.of(model(input_ids=ids, use_cache=True))
        want = model(input_ids=ids[:, :1], use_cache=True, **{cache_argument.name(): cache}).logits
    assert torch.equal(got, want)


def test_applied_entries():
    import optimum.exporters.onnx  # noqa: F401  (triggers the import shims)

    names = {shim.attr for shim in transformers5.applied}
    if TRANSFORMERS.major < 5:
        assert names == set()
    else:
        assert {"get_parameter_dtype", "is_offline_mode", "_CAN_RECORD_REGISTRY", "OutputRecorder"} <= names


def test_install_is_cheap_and_optimum_imports():
    """In a fresh process without the start-up hook: install() imports neither transformers nor optimum, then
    optimum-onnx imports and lists llama's tasks."""
    code = """
import sys, time
import legacy_bridge
t = time.perf_counter()
legacy_bridge.install(); legacy_bridge.install()
elapsed = time.perf_counter() - t
heavy = [m for m in ("transformers", "optimum.exporters", "optimum.onnxruntime") if m in sys.modules]
assert not heavy, f"install() imported {heavy}"
import optimum.exporters.onnx, optimum.onnxruntime
from optimum.exporters.onnx import main_export
from optimum.onnxruntime import ORTModelForCausalLM
from optimum.exporters.tasks import TasksManager
tasks = TasksManager.get_supported_tasks_for_model_type("llama", "onnx", library_name="transformers")
assert "text-generation-with-past" in tasks, tasks
print(f"{elapsed:.4f}")
"""
    env = dict(os.environ, HF_HUB_OFFLINE="1", OPTIMUM_DYNAMO_DISABLE="1")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert float(out.stdout.split()[-1]) < 0.5


def test_absorbed_inputs_are_what_the_pytorch_class_drops_in_generation():
    """`ORTModelForSpeechSeq2Seq.generate` drops what the PyTorch class for the config takes in its own
    `prepare_inputs_for_generation` and not in `forward` (Cohere ASR's `audio_chunk_index`); nothing for the others.
    End to end (a Cohere ASR export fed its extractor's whole output): test_seq2seq_cli, `slow`."""
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    from legacy_bridge.ort_absorbed_inputs import absorbed

    for model_type in ("whisper", "speech_to_text", "moonshine", "seamless_m4t"):
        assert absorbed(AutoConfig.for_model(model_type)) == frozenset(), model_type
    assert absorbed(AutoConfig.for_model("llama")) == frozenset()  # not of the speech mapping
    if "cohere_asr" in CONFIG_MAPPING_NAMES:
        assert absorbed(AutoConfig.for_model("cohere_asr")) == {"audio_chunk_index"}


@pytest.mark.skipif(TRANSFORMERS < Version("5.24"), reason="per-layer configs are new in transformers 5.24")
def test_text_sizes_lifted_from_a_per_layer_config():
    """gemma4's text config (5.24) refuses a global read of `head_dim`, which varies per layer: the runtime lifts
    the other sizes onto the composite config and leaves `head_dim` to the graph's cache shapes (ORTModelForCausalLM
    failed to load gemma4 and gemma4_unified; end to end: the causal zoo)."""
    from transformers import AutoConfig

    from legacy_bridge.ort_runtime import global_size, lift_text_sizes

    config = AutoConfig.for_model("gemma4")
    text = config.get_text_config()
    assert global_size(text, "head_dim") is None and global_size(text, "absent_size", "x") == "x"
    lift_text_sizes(config)
    assert (config.hidden_size, config.num_attention_heads) == (text.hidden_size, text.num_attention_heads)
    assert "head_dim" not in vars(config)


# ── End to end: a grouped-query gemma2 exported with torch.onnx.export(dynamo=True), run by ORTModelForCausalLM ──


def _tiny_gemma2():
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        "gemma2", vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,  # GQA, head_dim != 32 // 4
        query_pre_attn_scalar=16, sliding_window=64, max_position_embeddings=128,
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


class _FlatDecoder(torch.nn.Module):
    """Flat tensors in and out (optimum's names), a DynamicCache inside."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, position_ids, past):
        from transformers.cache_utils import DynamicCache

        cache = DynamicCache([(past[i], past[i + 1]) for i in range(0, len(past), 2)])
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         past_key_values=cache, use_cache=True)
        present = [t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)]
        return out.logits, present


@contextlib.contextmanager
def _keep_attention_mask():
    """transformers may drop the mask when it sees no padding; the graph must keep it."""
    import transformers.masking_utils as masking_utils

    original = masking_utils._ignore_causal_mask_sdpa
    masking_utils._ignore_causal_mask_sdpa = lambda *args, **kwargs: False
    try:
        yield
    finally:
        masking_utils._ignore_causal_mask_sdpa = original


def export_decoder_dynamo(model, out_dir):
    """Write out_dir/model.onnx with optimum's I/O names; batch, sequence and past axes dynamic."""
    config = model.config
    layers, kv_heads, head_dim = config.num_hidden_layers, config.num_key_value_heads, config.head_dim
    batch, seq, past_len = 2, 3, 4
    input_ids = torch.randint(3, config.vocab_size, (batch, seq))
    attention_mask = torch.ones(batch, past_len + seq, dtype=torch.long)
    position_ids = torch.arange(past_len, past_len + seq).expand(batch, -1)
    past = [torch.randn(batch, kv_heads, past_len, head_dim) for _ in range(2 * layers)]
    dyn = torch.export.Dim.DYNAMIC
    kv_names = [f"{i}.{kind}" for i in range(layers) for kind in ("key", "value")]
    with _keep_attention_mask(), torch.no_grad():
        program = torch.onnx.export(
            _FlatDecoder(model),
            (input_ids, attention_mask, position_ids, past),
            dynamo=True,
            input_names=["input_ids", "attention_mask", "position_ids", *[f"past_key_values.{n}" for n in kv_names]],
            output_names=["logits", *[f"present.{n}" for n in kv_names]],
            dynamic_shapes=({0: dyn, 1: dyn}, {0: dyn, 1: dyn}, {0: dyn, 1: dyn}, [{0: dyn, 2: dyn}] * (2 * layers)),
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    program.save(str(out_dir / "model.onnx"))
    return out_dir


@pytest.fixture(scope="module")
def gemma2(tmp_path_factory):
    """(PyTorch model, dir with model.onnx + config.json)."""
    root = tmp_path_factory.mktemp("gemma2")
    model = _tiny_gemma2()
    model.save_pretrained(root / "pt")
    start = time.perf_counter()
    onnx_dir = export_decoder_dynamo(model, root / "onnx")
    print(f"dynamo export: {time.perf_counter() - start:.1f}s")
    shutil.copy(root / "pt" / "config.json", onnx_dir / "config.json")
    return model, onnx_dir


PROMPT = torch.tensor([[0, 0, 5, 6, 7], [8, 9, 10, 11, 12]])  # left-padded batch of 2
GREEDY = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=0)


def _generate(model, prompt=PROMPT):
    return model.generate(input_ids=prompt, attention_mask=(prompt != 0).long(), **GREEDY)


def test_gqa_generate_matches_pytorch(gemma2):
    from optimum.onnxruntime import ORTModelForCausalLM

    model, onnx_dir = gemma2
    ort = ORTModelForCausalLM.from_pretrained(onnx_dir)
    assert (ort.num_key_value_heads, ort.embed_size_per_head) == (2, 16)
    expected = _generate(model)
    got = _generate(ort)
    assert got.shape == (2, PROMPT.shape[1] + 8)
    assert torch.equal(got, expected), f"\nORT     {got}\nPyTorch {expected}"
    # No padding: transformers >= 5.14 drops the all-ones mask, the session still needs one.
    unpadded = PROMPT[1:]
    assert torch.equal(_generate(ort, unpadded), _generate(model, unpadded))


def test_without_fix_first_step_fails(gemma2):
    from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument
    from optimum.onnxruntime import ORTModelForCausalLM

    _, onnx_dir = gemma2
    ort_runtime.uninstall()
    try:
        ort = ORTModelForCausalLM.from_pretrained(onnx_dir)
        # optimum's own guess: num_attention_heads and hidden_size // num_attention_heads
        assert (ort.num_key_value_heads, ort.embed_size_per_head) == (4, 8)
        with pytest.raises(InvalidArgument, match="past_key_values"):
            _generate(ort)
    finally:
        legacy_bridge.install()
    assert ORTModelForCausalLM.from_pretrained(onnx_dir).num_key_value_heads == 2


def test_dynamic_cache_dims_fall_back_to_config(gemma2, tmp_path):
    """A graph whose kv-head and head dims are symbolic: sizes come from the config."""
    import onnx
    from optimum.onnxruntime import ORTModelForCausalLM

    model, onnx_dir = gemma2
    proto = onnx.load(str(onnx_dir / "model.onnx"))
    for value in list(proto.graph.input) + list(proto.graph.output):
        if value.name.startswith(("past_key_values.", "present.")):
            dims = value.type.tensor_type.shape.dim
            dims[1].dim_param, dims[3].dim_param = "kv_heads", "head_dim"
    onnx.save(proto, str(tmp_path / "model.onnx"))
    shutil.copy(onnx_dir / "config.json", tmp_path / "config.json")

    ort = ORTModelForCausalLM.from_pretrained(tmp_path)
    assert ort_runtime.cache_dims(ort) == (2, 16)
    assert (ort.num_key_value_heads, ort.embed_size_per_head) == (2, 16)
    assert torch.equal(_generate(ort), _generate(model))


# ── optimum's own torchscript exporter (nice to have on transformers 5) ──


def test_torchscript_export_then_generate(tmp_path):
    from optimum.exporters.onnx import main_export
    from optimum.onnxruntime import ORTModelForCausalLM
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        "llama", vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    model.save_pretrained(tmp_path / "pt")
    main_export(str(tmp_path / "pt"), output=tmp_path / "onnx", task="text-generation-with-past")
    ort = ORTModelForCausalLM.from_pretrained(tmp_path / "onnx")
    assert torch.equal(_generate(ort), _generate(model))
