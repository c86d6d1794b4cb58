"""`--dynamo --quantize int4|int8`: MatMulNBits weights, judged against the fp32 graph, run by optimum's runtime;
refusals in one line; optimum's own `onnxruntime quantize` / `optimize` commands on a `--dynamo` export."""

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
import torch
from optimum.exporters.onnx import main_export
from optimum.onnxruntime import ORTModelForCausalLM
from transformers import AutoModelForCausalLM, AutoTokenizer

from optimum_dynamo.errors import ExportError
from optimum_dynamo.exporters.onnx_passes.quantize import QuantizeWeights, Scheme
from optimum_dynamo.manifest import read_manifest
from optimum_dynamo.validate.quantized import MAX_REL_RMS, MIN_TOP1
from parity import greedy, padded_batch
from tiny import save_tiny_model

from conftest import cli_export, memoized, optimum_cli

MODELS = ["llama", "qwen2", "phi3", "gemma2"]
TASK = "text-generation-with-past"


@pytest.fixture(scope="module")
def quantized(checkpoints, tmp_path_factory):
    """quantized((model_type, scheme)) -> export dir. int4 at --optimize O3 (as users ask for speed; llama's
    through the CLI, the others through main_export), int8 at the default level."""
    root = tmp_path_factory.mktemp("quantized")

    def make(key):
        model_type, scheme = key
        out = root / f"{model_type}-{scheme}"
        if (model_type, scheme) == ("llama", "int4"):
            return cli_export(out, "--model", checkpoints(model_type), "--task", TASK, "--quantize", "int4",
                              "--optimize", "O3", "--no-fallback")
        main_export(str(checkpoints(model_type)), out, task=TASK, dynamo=True, quantize=scheme,
                    optimize="O3" if scheme == "int4" else None)
        return out

    return memoized(make)


def _agreement(got: torch.Tensor, expected: torch.Tensor, keep: torch.Tensor) -> tuple[float, float]:
    """Top-1 agreement and RMS error / std of the reference, on the unpadded positions."""
    got, expected = got[keep].double(), expected[keep].double()
    top1 = (got.argmax(-1) == expected.argmax(-1)).double().mean().item()
    return top1, ((got - expected).pow(2).mean().sqrt() / expected.std()).item()


def _graph_ops(out) -> list[onnx.NodeProto]:
    return list(onnx.load(str(out / "model.onnx"), load_external_data=False).graph.node)


# llama's and qwen2's 4-bit graphs are made in both environments (the gate test reads them); the other pairs run in
# one environment each, every model and scheme in both.
ONCE = {("llama", "int8"): "t5", ("qwen2", "int4"): "t4", ("qwen2", "int8"): "t4", ("phi3", "int4"): "t4",
        ("phi3", "int8"): "t5", ("gemma2", "int4"): "t5", ("gemma2", "int8"): "t4"}


@pytest.mark.parametrize("model_type, scheme", [
    pytest.param(m, s, marks=pytest.mark.once(ONCE[m, s])) if (m, s) in ONCE else (m, s)
    for m in MODELS for s in ("int4", "int8")])
def test_quantized_decoder_in_optimum_runtime(model_type, scheme, checkpoints, dynamo_exports, quantized):
    """A left-padded batch through ORTModelForCausalLM: logits meet the gate's metric against PyTorch, greedy
    generation runs; the manifest records the scheme; every linear weight is packed."""
    out, bits = quantized((model_type, scheme)), int(scheme[3:])
    ort_model = ORTModelForCausalLM.from_pretrained(out)
    torch_model = AutoModelForCausalLM.from_pretrained(checkpoints(model_type)).eval()
    inputs = padded_batch(AutoTokenizer.from_pretrained(out))
    with torch.no_grad():
        expected = torch_model(**inputs).logits
    top1, rel_rms = _agreement(ort_model(**inputs).logits, expected, inputs["attention_mask"].bool())
    assert top1 >= MIN_TOP1[bits] and rel_rms <= MAX_REL_RMS[bits], (top1, rel_rms)
    tokens = greedy(ort_model, inputs)
    assert tokens.shape == (2, inputs["input_ids"].shape[1] + 8)

    record = read_manifest(out)["quantization"]
    assert {k: record[k] for k in ("bits", "block_size", "symmetric", "accuracy_level", "head", "embeddings",
                                   "kept")} == {"bits": bits, "block_size": 32, "symmetric": True, "accuracy_level": 4,
                                                "head": True, "embeddings": False, "kept": []}
    gated = next(row for row in record["validation"] if row["against"] == "fp32 graph")
    assert gated["top1"] >= MIN_TOP1[bits] and gated["rel_rms"] <= MAX_REL_RMS[bits]
    ops = _graph_ops(out)
    nbits = [n for n in ops if n.op_type == "MatMulNBits"]
    assert len(nbits) == record["quantized"] > 0
    assert {a.name: a.i for n in nbits for a in n.attribute if a.name in ("bits", "block_size")} == {
        "bits": bits, "block_size": 32}
    weights = {t.name: t.dims for t in onnx.load(str(out / "model.onnx"), load_external_data=False).graph.initializer}
    linear = [n.name for n in ops if n.op_type == "MatMul" and weights.get(n.input[1], [0, 0])[-2] >= 32]
    assert not linear  # no fp32 linear layer left (rotary frequencies, K = 1, keep theirs)
    fp32 = dynamo_exports(model_type) / "model.onnx_data"
    assert (out / "model.onnx_data").stat().st_size < fp32.stat().st_size
    assert not (out / ".fp32").exists()


@pytest.mark.once("t5")
def test_from_pretrained_head_and_embeddings(checkpoints):
    """`from_pretrained(export=True, dynamo=True, quantize="int4", quantize_head=False, quantize_embeddings=True)`:
    the vocabulary projection stays a MatMul on fp32 weights, the embeddings become GatherBlockQuantized, the
    manifest says so, and the model still generates."""
    model = ORTModelForCausalLM.from_pretrained(checkpoints("llama"), export=True, dynamo=True, quantize="int4",
                                                quantize_head=False, quantize_embeddings=True)
    record = read_manifest(model.model_save_dir)["quantization"]
    assert (record["bits"], record["head"], record["embeddings"], len(record["kept"])) == (4, False, True, 1)
    graph = onnx.load(str(model.model_save_dir / "model.onnx"), load_external_data=False).graph
    assert [n.op_type for n in graph.node if record["kept"][0] in n.input] == ["MatMul"]
    assert [n.op_type for n in graph.node if n.op_type.startswith("Gather") and "input_ids" in n.input] == [
        "GatherBlockQuantized"]
    inputs = padded_batch(AutoTokenizer.from_pretrained(checkpoints("llama")))
    assert greedy(model, inputs).shape == (2, inputs["input_ids"].shape[1] + 8)


@pytest.mark.parametrize("flags, error", [
    (["--quantize", "int4"], "--quantize: only the dynamo exporter has this option; add --dynamo (for the "
                             "torchscript export's weights: optimum-cli onnxruntime quantize)"),
    (["--dynamo", "--quantize", "int4", "--dtype", "fp16"], "--quantize with --dtype fp16: quantize from the fp32 "
     "export (drop --dtype; activations stay fp32, weights are stored in 4 or 8 bits)"),
])
def test_cli_refusals(flags, error, checkpoints, tmp_path):
    run = optimum_cli("export", "onnx", "--model", checkpoints("llama"), "--task", TASK, *flags, tmp_path / "out")
    assert run.returncode != 0
    assert run.stderr.strip().splitlines()[-1].endswith(error), run.stderr[-2000:]
    assert not (tmp_path / "out").exists()


def test_python_refusals(checkpoints, tmp_path):
    seq2seq = save_tiny_model("bart", "text2text-generation", tmp_path / "bart")
    cases = [
        (dict(model_name_or_path=str(seq2seq), task="text2text-generation-with-past"),
         "^--quantize is not supported for encoder-decoder exports with --dynamo yet"),
        (dict(model_name_or_path=str(checkpoints("llama")), task=TASK, do_constant_folding=False),
         r"^--quantize needs the graph optimizer \(weights folded into constants\); drop --no-constant-folding$"),
        (dict(model_name_or_path=str(checkpoints("llama")), task=TASK, optimize="O4"), "^--optimize O4"),
        (dict(model_name_or_path=str(checkpoints("llama")), task=TASK, quantize="int2"),
         r"^invalid --quantize 'int2' \(choose from int4, int8\)$"),
        (dict(model_name_or_path=str(checkpoints("llama")), task=TASK, quantize="int8", quantize_embeddings=True),
         r"^--quantize-embeddings: embeddings are stored in 4 bits only \(onnxruntime's GatherBlockQuantized\); "),
        (dict(model_name_or_path=str(checkpoints("llama")), task=TASK, quantize=None, quantize_head=False),
         r"^--quantize-embeddings / --no-quantize-head apply to --quantize: add --quantize int4\|int8$"),
    ]
    for kwargs, error in cases:
        kwargs = {"quantize": "int4", **kwargs}
        with pytest.raises(ExportError, match=error):
            main_export(output=tmp_path / "out", dynamo=True, **kwargs)
        assert not (tmp_path / "out").exists()


@pytest.mark.once("t4")
def test_optimum_onnxruntime_commands_on_a_dynamo_export(checkpoints, dynamo_exports, tmp_path):
    """optimum's own `onnxruntime quantize --avx2` (dynamic int8) and `optimize -O2` read our export, and
    ORTModelForCausalLM runs what they write."""
    export = dynamo_exports("llama")
    inputs = padded_batch(AutoTokenizer.from_pretrained(export))
    with torch.no_grad():
        expected = AutoModelForCausalLM.from_pretrained(checkpoints("llama")).eval()(**inputs).logits
    for command, file_name in ((["quantize", "--avx2"], "model_quantized.onnx"), (["optimize", "-O2"],
                                                                                  "model_optimized.onnx")):
        out = tmp_path / command[0]
        run = optimum_cli("onnxruntime", *command, "--onnx_model", export, "-o", out)
        assert run.returncode == 0, run.stderr[-2000:]
        model = ORTModelForCausalLM.from_pretrained(out, file_name=file_name)
        top1, _ = _agreement(model(**inputs).logits, expected, inputs["attention_mask"].bool())
        assert top1 >= 0.9, (command, top1)
        assert greedy(model, inputs).shape[0] == 2
        assert (export / "model.onnx_data").is_file()  # optimum's optimizer deleted it (legacy_bridge.ort_optimizer)


def _two_matmuls(rng) -> tuple[ir.Model, np.ndarray, np.ndarray]:
    """x @ w1 @ w2 -> logits, w1 a transposed (non-contiguous) array as constant folding leaves them."""
    w1 = rng.standard_normal((32, 64)).astype(np.float32).T
    w2 = rng.standard_normal((32, 48)).astype(np.float32)
    x = ir.Value(name="x", shape=ir.Shape(["b", 64]), type=ir.TensorType(ir.DataType.FLOAT))
    c1, c2 = (ir.Value(name=n, const_value=ir.tensor(w, name=n)) for n, w in (("w1", w1), ("w2", w2)))
    m1 = ir.node("MatMul", [x, c1])
    m2 = ir.node("MatMul", [m1.outputs[0], c2])
    m2.outputs[0].name = "logits"
    graph = ir.Graph([x], [m2.outputs[0]], nodes=[m1, m2], initializers=[c1, c2], opset_imports={"": 21})
    feed = rng.standard_normal((3, 64)).astype(np.float32)
    return ir.Model(graph, ir_version=10), feed, feed @ w1 @ w2


@pytest.mark.parametrize("head", [True, False])
def test_quantize_pass_on_a_small_graph(head):
    """Each constant weight becomes MatMulNBits in onnxruntime's block layout (the strided one included: the
    packer reads raw memory); with head=False the MatMul producing `logits` keeps its fp32 weight."""
    model, feed, expected = _two_matmuls(np.random.default_rng(0))
    done = QuantizeWeights(Scheme.named("int8", head=head))
    done(model)
    assert [n.op_type for n in model.graph] == (["MatMulNBits"] * 2 if head else ["MatMulNBits", "MatMul"])
    assert done.kept == ([] if head else ["w2"]) and set(model.graph.initializers) >= ({"w2"} if not head else set())
    proto = ir.serde.serialize_model(model).SerializeToString()
    got = ort.InferenceSession(proto, providers=["CPUExecutionProvider"]).run(None, {"x": feed})[0]
    assert np.abs(got - expected).max() < 0.02 * np.abs(expected).max()


def test_gate_tells_quantization_from_a_wrong_graph(dynamo_exports, quantized):
    """The gate's metric on real graphs: llama's 4-bit graph against llama's fp32 graph passes; qwen2's 4-bit
    graph (another model with the same inputs: a wrong graph) against it is refused."""
    from optimum_dynamo.validate import GrossMismatch, quantized as check

    fp32 = dynamo_exports("llama")
    reference_session = ort.InferenceSession(str(fp32 / "model.onnx"))
    inputs = padded_batch(AutoTokenizer.from_pretrained(fp32))
    feed = dict(inputs, position_ids=(inputs["attention_mask"].cumsum(-1) - 1).clamp(min=0))
    for i in reference_session.get_inputs():
        if i.name.startswith("past_key_values"):
            feed[i.name] = torch.zeros(2, i.shape[1], 0, i.shape[3])
    cases, names = [(feed, {})], [i.name for i in reference_session.get_inputs()]
    reference = check.logits_of(reference_session, cases, names)
    for model_type, wrong in (("llama", False), ("qwen2", True)):
        got = check.logits_of(ort.InferenceSession(str(quantized((model_type, "int4")) / "model.onnx")), cases, names)
        rows = [check.agreement("fp32 graph", got, reference, cases)]
        if wrong:
            with pytest.raises(GrossMismatch, match="^the 4-bit graph disagrees with its fp32 graph beyond quantization"):
                check.gate(rows, 4)
        else:
            check.gate(rows, 4)
