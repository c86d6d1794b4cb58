"""Sliding-window caches are exported bounded (at most `window - 1` positions), like eager keeps them."""

import onnx
import onnxruntime as ort
import pytest
import torch
from optimum.onnxruntime import ORTModelForCausalLM
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.cache_utils import DynamicSlidingWindowLayer

from optimum_dynamo import patches
from optimum_dynamo.capture.infer import SLIDING_PAST, name_axes
from tiny import save_tiny_decoder
from parity import assert_causal_lm_parity, padded_batch

from conftest import optimum_cli

WINDOW = 6  # shorter than the padded prompt (9 tokens) + 8 new tokens


@pytest.fixture(scope="module")
def sliding_exports(tmp_path_factory):
    root, made = tmp_path_factory.mktemp("sliding"), {}

    def get(model_type: str):
        if model_type not in made:
            overrides = dict(sliding_window=WINDOW)
            if model_type == "gemma2":  # layers alternate sliding / full
                overrides.update(head_dim=16, query_pre_attn_scalar=16)
            ckpt = save_tiny_decoder(model_type, root / f"{model_type}-ckpt", **overrides)
            out = root / model_type
            run = optimum_cli("export", "onnx", "--dynamo", "--model", ckpt, "--task", "text-generation-with-past", out)
            assert run.returncode == 0, run.stderr[-3000:]
            made[model_type] = ckpt, out
        return made[model_type]

    return get


@pytest.mark.parametrize("model_type", [pytest.param("mistral", marks=pytest.mark.once("t4")), "gemma2"])
def test_bounded_cache_generates_like_pytorch(model_type, sliding_exports):
    ckpt, out = sliding_exports(model_type)
    ort_model = ORTModelForCausalLM.from_pretrained(out)
    torch_model = AutoModelForCausalLM.from_pretrained(ckpt).eval()
    inputs = padded_batch(AutoTokenizer.from_pretrained(out))
    assert inputs["input_ids"].shape[1] > WINDOW
    assert_causal_lm_parity(ort_model, torch_model, inputs)


def _cache_axes(path):
    graph = onnx.load(str(path / "model.onnx"), load_external_data=False).graph
    return {v.name: v.type.tensor_type.shape.dim[2].dim_param for v in graph.input if v.name.startswith("past_key")}


def test_sliding_layers_hold_window_minus_one(sliding_exports):
    """gemma2: layer 0 slides, layer 1 is full. After a 9-token prompt the sliding present holds 5 positions."""
    _, out = sliding_exports("gemma2")
    axes = _cache_axes(out)
    assert axes["past_key_values.0.key"] == SLIDING_PAST and axes["past_key_values.1.key"] == "past_sequence_length"
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    batch, length = 2, 9
    feed = {
        "input_ids": torch.randint(4, 100, (batch, length)).numpy(),
        "attention_mask": torch.ones(batch, length, dtype=torch.int64).numpy(),
        "position_ids": torch.arange(length).expand(batch, -1).numpy(),
    }
    for inp in session.get_inputs():
        if inp.name.startswith("past_key_values"):
            feed[inp.name] = torch.zeros(batch, inp.shape[1], 0, inp.shape[3]).numpy()
    names = [o.name for o in session.get_outputs()]
    outputs = dict(zip(names, session.run(None, feed)))
    assert outputs["present.0.key"].shape[2] == WINDOW - 1
    assert outputs["present.1.key"].shape[2] == length


@pytest.mark.parametrize("chunks", [[1] * 12, [3, 1, 1, 4, 1], [9, 1, 1], [2, 2, 2, 2]])
def test_patched_layer_equals_eager(chunks):
    """The export replacements keep the same positions and report the same mask sizes as eager."""
    torch.manual_seed(0)
    eager, patched = DynamicSlidingWindowLayer(WINDOW), DynamicSlidingWindowLayer(WINDOW)
    for n in chunks:
        k, v = torch.randn(1, 2, n, 4), torch.randn(1, 2, n, 4)
        cache_position = torch.arange(eager.cumulative_length, eager.cumulative_length + n)
        query = cache_position if "cache_position" in DynamicSlidingWindowLayer.get_mask_sizes.__code__.co_varnames else n
        if eager.is_initialized:
            expected = eager.get_mask_sizes(query)
        full_eager = eager.update(k, v)
        with patches.applied():
            if patched.is_initialized:
                assert tuple(int(x) for x in patched.get_mask_sizes(query)) == tuple(int(x) for x in expected)
            full_patched = patched.update(k, v)
        assert torch.equal(full_patched[0], full_eager[0]) and torch.equal(full_patched[1], full_eager[1])
        assert torch.equal(patched.keys, eager.keys) and torch.equal(patched.values, eager.values)
        assert patched.cumulative_length == eager.cumulative_length


def test_capped_axis_never_shares_the_full_past_name():
    """Within the window the sliding and full pasts have equal sizes, yet they keep separate names and
    the mask length is named after the full past only."""
    flats = []
    for past, new in ((0, 3), (3, 1), (4, 1)):
        cache = torch.zeros(2, 2, past, 4)
        flats.append({
            "input_ids": torch.zeros(2, new, dtype=torch.long),
            "attention_mask": torch.ones(2, past + new, dtype=torch.long),
            "past_key_values.0.key": cache, "past_key_values.1.key": cache,
        })
    dynamic = {"input_ids": {0, 1}, "attention_mask": {0, 1}, "past_key_values.0.key": {0, 2}, "past_key_values.1.key": {0, 2}}
    names = name_axes(flats, dynamic, bounded={"past_key_values.0.key"})
    assert names["past_key_values.0.key"][2] == SLIDING_PAST
    assert names["past_key_values.1.key"][2] == "past_sequence_length"
    assert names["attention_mask"][1] == "past_sequence_length + sequence_length"



def test_capped_past_stays_dynamic_when_every_call_had_a_full_window():
    """Decode steps past the window all carry `window - 1` positions: the axis is still dynamic
    (a shorter past comes with shorter prompts), so the sample is grown instead of fixing it."""
    from transformers import DynamicCache

    from optimum_dynamo.capture import infer_arguments
    from optimum_dynamo.capture.observer import Call

    calls = []
    for step in range(3):
        layer = DynamicSlidingWindowLayer(WINDOW)
        layer.update(torch.randn(2, 2, WINDOW - 1, 4), torch.randn(2, 2, WINDOW - 1, 4))
        cache = DynamicCache()
        cache.layers = [layer]
        total = 10 + step
        calls.append(Call({"input_ids": torch.zeros(2, 1, dtype=torch.long),
                           "attention_mask": torch.ones(2, total + 1, dtype=torch.long),
                           "past_key_values": cache}, None))
    args = infer_arguments(calls, ["input_ids", "attention_mask", "past_key_values"])
    assert args.axis_names["past_key_values.0.key"] == {0: "batch_size", 2: SLIDING_PAST}
    assert args.dynamic_shapes["past_key_values"][0] == {0: torch.export.Dim.DYNAMIC, 2: torch.export.Dim.DYNAMIC}
