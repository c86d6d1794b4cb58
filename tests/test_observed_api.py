"""The three-step Python API: observe your own code, export the observed module, check discrepancies."""

import onnxruntime
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

from optimum_dynamo import export_observed, observe
from optimum_dynamo.flatten import flat_inputs, flat_outputs, registered
from tiny import save_tiny_model
from optimum_dynamo.validate import substitute_missing

from conftest import optimum_cli


def _session(path):
    return onnxruntime.InferenceSession(str(path / "model.onnx"), providers=["CPUExecutionProvider"])


def test_batch_1_generate_exports_a_graph_that_runs_at_batch_3(checkpoints, tmp_path):
    path = checkpoints("llama")
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    with observe(model) as obs:  # a user's own loop: one prompt, one generate
        inputs = tokenizer(["the quick brown fox"], return_tensors="pt")
        model.generate(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                       max_new_tokens=4, min_new_tokens=4, do_sample=False)
    assert {c.kwargs["input_ids"].shape[0] for c in obs.calls} == {1}
    result = export_observed(obs, tmp_path / "onnx", atol=1e-4)
    assert max(d.max_abs for d in result.discrepancies) < 1e-4

    # Batch 3, prefill of 5 tokens (unpadded), compared with PyTorch on the same inputs.
    session, args = _session(tmp_path / "onnx"), result.arguments
    ids = torch.randint(3, 100, (3, 5), generator=torch.Generator().manual_seed(0))
    call = {"input_ids": ids, "attention_mask": torch.ones(3, 5, dtype=torch.long),
            "position_ids": torch.arange(5).expand(3, 5), "cache_position": torch.arange(5)}
    call = {k: v for k, v in call.items() if k in args.input_names}
    feed = substitute_missing(call, args)
    got = session.run(None, {n: feed[n].numpy() for n in args.input_names})
    with torch.no_grad():
        expected = model(**call, use_cache=True, logits_to_keep=1).logits
    assert got[0].shape == (3, 1, model.config.vocab_size)
    assert (torch.from_numpy(got[0]) - expected).abs().max().item() < 1e-4


def test_input_present_only_on_first_call_exports_and_runs_with_and_without_it(tmp_path):
    path = save_tiny_model("bert", "text-classification", tmp_path / "bert")
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    g = torch.Generator().manual_seed(0)
    first = {"input_ids": torch.randint(5, 100, (2, 6), generator=g), "token_type_ids": torch.ones(2, 6, dtype=torch.long)}
    later = {"input_ids": torch.randint(5, 100, (3, 9), generator=g)}
    with observe(model) as obs, torch.no_grad():
        model(**first)
        model(**later)
    result = export_observed(obs, tmp_path / "onnx", atol=1e-4)
    assert result.arguments.input_names == ["input_ids", "token_type_ids"]
    session, args = _session(tmp_path / "onnx"), result.arguments
    for call in (first, later):  # without token_type_ids the documented substitution (zeros) applies
        feed = substitute_missing(flat_inputs(call, list(call)), args)
        got = session.run(None, {n: feed[n].numpy() for n in args.input_names})[0]
        with torch.no_grad():
            expected = model(**call).logits
        assert (torch.from_numpy(got) - expected).abs().max().item() < 1e-4

    # A per-input override of the substitution: token types of ones for the later call.
    ones = {"token_type_ids": lambda sizes: torch.ones(sizes["batch_size"], sizes["sequence_length"], dtype=torch.long)}
    feed = substitute_missing(flat_inputs(later, list(later)), args, fill=ones)
    got = session.run(None, {n: feed[n].numpy() for n in args.input_names})[0]
    with torch.no_grad():
        expected = model(**later, token_type_ids=torch.ones_like(later["input_ids"])).logits
    assert (torch.from_numpy(got) - expected).abs().max().item() < 1e-4


@pytest.mark.once("t4")
def test_atol_below_the_measured_difference_fails_naming_the_output(checkpoints, tmp_path):
    out = tmp_path / "onnx"
    run = optimum_cli("export", "onnx", "--dynamo", "--model", checkpoints("llama"), "--atol", "1e-12", out)
    assert run.returncode != 0
    errors = [line for line in run.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "differs from PyTorch by" in errors[0] and "> atol 1e-12" in errors[0]
    assert "output 'logits'" in errors[0] or "output 'present." in errors[0]
    assert not out.exists()


def test_sequence_forced_dynamic_when_every_call_had_the_same_length(tmp_path):
    path = save_tiny_model("bert", "text-classification", tmp_path / "bert")
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    g = torch.Generator().manual_seed(0)
    with observe(model) as obs, torch.no_grad():
        for batch in (2, 3):  # always 6 tokens
            model(input_ids=torch.randint(5, 100, (batch, 6), generator=g), attention_mask=torch.ones(batch, 6, dtype=torch.long))
    result = export_observed(obs, tmp_path / "onnx", dynamic_sequence=True)
    assert result.arguments.axis_names["attention_mask"] == {0: "batch_size", 1: "sequence_length"}
    session = _session(tmp_path / "onnx")
    ids = torch.randint(5, 100, (4, 11), generator=g)
    feed = {"input_ids": ids.numpy(), "attention_mask": torch.ones(4, 11, dtype=torch.long).numpy()}
    got = torch.from_numpy(session.run(None, feed)[0])
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=torch.ones(4, 11, dtype=torch.long)).logits
    assert (got - expected).abs().max().item() < 1e-4


def test_nan_outputs_count_as_the_worst_difference(tmp_path):
    """A NaN in onnxruntime's output must not look like a small difference (real ORT session, x / x)."""
    import onnx
    from onnx import TensorProto, helper

    from optimum_dynamo.capture import Call, ExportArguments
    from optimum_dynamo.validate import compare, references

    graph = helper.make_graph(
        [helper.make_node("Div", ["x", "x"], ["y"])], "nan",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    onnx.save(model, tmp_path / "nan.onnx")
    session = onnxruntime.InferenceSession(str(tmp_path / "nan.onnx"), providers=["CPUExecutionProvider"])
    x = torch.tensor([0.0, 1.0, 2.0])
    args = ExportArguments(kwargs={"x": x}, dynamic_shapes={"x": None}, input_names=["x"], axis_names={}, sample_call=0)
    (row,) = compare(session, references([Call({"x": x}, {"y": torch.ones(3)})], args, model=None), args, ["y"])
    assert row.output == "y" and row.max_abs == float("inf")
