"""Weights streamed from the checkpoint (`optimum_dynamo.streaming`, docs/big-models.md): the real optimum-cli with
OPTIMUM_DYNAMO_STREAM_WEIGHTS=1 writes the same bytes as with the weights in memory, and a checkpoint in the shape
big ones come (bf16, sharded) exports and generates PyTorch's tokens. Memory itself is measured by
`benchmarks/big.py`, not here."""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from optimum_dynamo import streaming

TASK = "text-generation-with-past"
STREAMED = "weights streamed from the checkpoint"


def _cli(*args, stream: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).parent / "optimum-cli"
    env = dict(os.environ, **{streaming.ENV: stream})
    return subprocess.run([str(exe), "export", "onnx", "--dynamo", *map(str, args)], capture_output=True, text=True,
                          timeout=900, env=env)


def _streamed(checkpoint: Path, out: Path, *flags) -> Path:
    run = _cli("--model", checkpoint, "--task", TASK, *flags, out, stream="1")
    assert run.returncode == 0, run.stderr[-3000:]
    assert STREAMED in run.stderr
    assert json.loads((out / "optimum_dynamo.json").read_text())["weights"] == "streamed from the checkpoint"
    assert not (out / ".offload").exists()
    return out


@pytest.mark.parametrize("model_type, flags", [
    pytest.param("mixtral", (), marks=pytest.mark.once("t5")),
    pytest.param("tied qwen2", ("--optimize", "O3", "--quantize", "int4"), marks=pytest.mark.once("t4")),
    pytest.param("llama", ("--dtype", "fp16"), marks=pytest.mark.slow),
], ids=["mixtral-fp32", "O3-int4", "fp16"])
def test_streamed_export_writes_the_same_bytes(checkpoints, dynamo_exports, tmp_path, model_type, flags):
    """Mixtral's checkpoint stores one tensor per expert: transformers 4 runs them as modules (the export's
    dense-experts patch must reach a module under an offload hook), transformers 5 stacks them on load.
    The tied qwen2's embedding (512 x 32) is above constant folding's size limit: its head, read through a
    Transpose, is quantized both ways. Without flags, the session's export of the checkpoint (a tiny model: in
    memory) is the reference."""
    if model_type == "tied qwen2":
        from tiny import save_tiny_decoder

        checkpoint = save_tiny_decoder("qwen2", tmp_path / "tied", tie_word_embeddings=True, vocab_size=512)
    else:
        checkpoint = checkpoints(model_type)
    streamed = _streamed(checkpoint, tmp_path / "streamed", *flags)
    in_memory = dynamo_exports(model_type) if not flags else tmp_path / "in_memory"
    if flags:
        run = _cli("--model", checkpoint, "--task", TASK, *flags, in_memory, stream="0")
        assert run.returncode == 0 and STREAMED not in run.stderr, run.stderr[-3000:]
    assert "weights" not in json.loads((in_memory / "optimum_dynamo.json").read_text())
    for name in ("model.onnx", "model.onnx_data"):
        assert (streamed / name).read_bytes() == (in_memory / name).read_bytes(), name
    if "int4" in flags:  # 2 layers x (packed qkv, o, packed gate-up, down) and the head
        assert json.loads((streamed / "optimum_dynamo.json").read_text())["quantization"]["quantized"] == 9
    _assert_pieces_match_the_whole_graph(streamed / "model.onnx")


def _feeds(session) -> list[dict]:
    """Batch 2: a 5-token prompt from an empty cache, then one token after a 5-position cache (by dim names)."""
    rng = np.random.default_rng(0)
    feeds = []
    for length, past in ((5, 0), (1, 5)):
        feed = {}
        for port in session.get_inputs():
            named = {"batch_size": 2, "sequence_length": length, "past_sequence_length": past,
                     "past_sequence_length + sequence_length": past + length}
            shape = [d if isinstance(d, int) else named[d] for d in port.shape]
            if port.name == "attention_mask":
                feed[port.name] = np.ones(shape, np.int64)
            elif port.name == "position_ids":
                feed[port.name] = np.arange(past, past + length, dtype=np.int64)[None].repeat(2, 0)
            elif port.type == "tensor(int64)":
                feed[port.name] = rng.integers(0, 100, shape)
            else:
                feed[port.name] = rng.standard_normal(shape).astype(np.float16 if "16" in port.type else np.float32)
        feeds.append(feed)
    return feeds


def _assert_pieces_match_the_whole_graph(path: Path) -> None:
    """The streamed export's validation runs the graph in pieces (`validate.piecewise`): cut small here (at
    least 5 pieces), they give the whole graph's outputs."""
    import onnxruntime as ort

    from optimum_dynamo.validate.piecewise import PiecewiseSession

    whole = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    pieces = PiecewiseSession(path, budget=(path.parent / "model.onnx_data").stat().st_size // 12)
    assert len(pieces.pieces) >= 5
    assert [(p.name, p.shape, p.type) for p in pieces.get_inputs()] == [(p.name, p.shape, p.type) for p in whole.get_inputs()]
    assert [p.name for p in pieces.get_outputs()] == [p.name for p in whole.get_outputs()]
    feeds = _feeds(whole)
    for feed, got in zip(feeds, pieces.run_all(feeds)):
        for expected, output in zip(whole.run(None, feed), got):
            assert output.shape == expected.shape
            # fp16: the fp32 products are rounded to fp16 where the pieces' sessions end, not after fused kernels
            atol = 1e-5 if output.dtype == np.float32 else 4e-3
            np.testing.assert_allclose(output.astype(np.float32), expected.astype(np.float32), atol=atol, rtol=0)


def test_an_outer_scope_read_crosses_a_cut():
    """An If's branches read a value of the graph around them: the piece holding the If takes it as an input."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from optimum_dynamo.validate.piecewise import PiecewiseSession

    weight = numpy_helper.from_array(np.full((4, 4), 0.5, np.float32), "w")
    branch = lambda op, name: helper.make_graph(  # noqa: E731
        [helper.make_node(op, ["h", "h"], [name])], name, [], [helper.make_tensor_value_info(name, TensorProto.FLOAT, None)])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["positive"]),
             helper.make_node("If", ["positive"], ["y"], then_branch=branch("Add", "a"), else_branch=branch("Mul", "m"))]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [weight, numpy_helper.from_array(np.zeros((), np.float32), "zero")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.onnx"
        onnx.save(model, str(path), save_as_external_data=True, location="model.onnx_data", size_threshold=0)
        pieces = PiecewiseSession(path, budget=64)
        assert len(pieces.pieces) == 2  # the MatMul's weight alone, then the rest
        whole = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        for x in (np.ones((1, 4), np.float32), -np.ones((1, 4), np.float32)):
            np.testing.assert_array_equal(pieces.run(None, {"x": x})[0], whole.run(None, {"x": x})[0])


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_a_weight_over_the_budget_runs_in_blocks_of_columns(dtype):
    """A head bigger than a piece may hold (its fp32 copy counted for fp16) runs as MatMuls over blocks of its
    columns, read from the file: onnxruntime's outputs of the whole graph, the cut the same as before and after."""
    import onnxruntime as ort
    from onnx import helper, numpy_helper

    from optimum_dynamo.validate.piecewise import PiecewiseSession

    rng = np.random.default_rng(0)
    kind = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    nodes = [helper.make_node("Mul", ["x", "scale"], ["h"]), helper.make_node("MatMul", ["h", "head"], ["logits"]),
             helper.make_node("Relu", ["logits"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", kind, ["batch", 3, 16])],
        [helper.make_tensor_value_info("y", kind, None)],
        [numpy_helper.from_array(rng.standard_normal((16, 1000)).astype(dtype), "head"),
         numpy_helper.from_array(np.full((16,), 0.5, dtype), "scale")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.onnx"
        onnx.save(model, str(path), save_as_external_data=True, location="model.onnx_data", size_threshold=0)
        pieces = PiecewiseSession(path, budget=4000)  # the head: 64 kB (fp32), 32 kB (fp16, held as 96 kB)
        assert [len(p) for p in pieces.pieces] == [1, 1, 1]
        assert pieces._oversized_weight(pieces.pieces[1]).name == "head"
        whole = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        x = rng.standard_normal((2, 3, 16)).astype(dtype)
        got, expected = (r.astype(np.float32) for r in (pieces.run(None, {"x": x})[0], whole.run(None, {"x": x})[0]))
        np.testing.assert_allclose(got, expected, atol=1e-5 if dtype == np.float32 else 2e-2, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_a_weight_is_written_in_blocks_of_rows_with_the_bytes_of_the_whole(tmp_path, dtype):
    """The save stage writes a streamed weight bigger than a block a few rows at a time, read from its safetensors
    file (bf16, as checkpoints come), never whole, and so is its transpose (a tied head's, also as [1, K, N]):
    the bytes of the whole tensor converted at once, and its columns as the quantizer reads them; a stored shape
    that is not the graph's is read whole, where the shape check speaks."""
    import onnx_ir as ir
    from safetensors.torch import save_file

    weight = torch.randn(37, 11).to(torch.bfloat16)
    save_file({"embed.weight": weight, "odd": weight[:5].clone()}, tmp_path / "model.safetensors")

    def convert(tensor):
        tensor = tensor.to(dtype).contiguous()
        return ir.tensor(tensor.numpy() if dtype != torch.bfloat16 else tensor)

    whole = convert(weight)
    stored = (str(tmp_path / "model.safetensors"), "embed.weight")
    def read_whole():
        raise AssertionError("read whole")

    blocked = streaming.CheckpointTensor(read_whole, stored, convert, block=100, dtype=whole.dtype,
                                         shape=whole.shape)
    head = blocked.transposed([1, 0], read_whole, "head")  # the tied head reads the embedding's transpose
    assert tuple(head.shape) == (11, 37)
    wide = head.unsqueezed(read_whole, "wide")  # stored [1, K, N] (`unpack_vocab`)
    assert tuple(wide.shape) == (1, 11, 37)
    for tensor, expected in ((blocked, whole), (head, convert(weight.t())), (wide, convert(weight.t()))):
        with open(tmp_path / "blocked", "wb") as file:
            tensor.tofile(file)
        assert (tmp_path / "blocked").read_bytes() == expected.tobytes()
        if dtype != torch.bfloat16:  # the quantizer's reads (fp32, fp16): columns a few at a time
            columns = np.concatenate(list(tensor.column_blocks(4)), axis=1)
            np.testing.assert_array_equal(columns, expected.numpy())

    def refuse():
        raise streaming.ExportError("the checkpoint's odd has shape (5, 11), the graph (37, 11)")

    odd = streaming.CheckpointTensor(refuse, (stored[0], "odd"), convert, block=100, dtype=whole.dtype,
                                     shape=whole.shape)
    with open(tmp_path / "odd", "wb") as file, pytest.raises(streaming.ExportError, match="has shape"):
        odd.tofile(file)
    assert odd.column_blocks(4) is None


@pytest.mark.once("t5")
def test_a_sharded_bf16_checkpoint_streams_and_generates_pytorchs_tokens(tmp_path):
    """bf16, three shards and an index, the head tied to the embedding, as 7B-70B checkpoints come: exported in
    fp32 with its weights streamed, ORTModelForCausalLM gives the greedy tokens of PyTorch's model loaded in fp32
    (a left-padded batch of two)."""
    from optimum.onnxruntime import ORTModelForCausalLM
    from transformers import AutoModelForCausalLM

    from tiny import save_tiny_decoder, tiny_tokenizer

    small = save_tiny_decoder("llama", tmp_path / "small", tie_word_embeddings=True)
    checkpoint = tmp_path / "bf16"
    AutoModelForCausalLM.from_pretrained(small).to(torch.bfloat16).save_pretrained(checkpoint, max_shard_size="10KB")
    tokenizer = tiny_tokenizer(128)
    tokenizer.save_pretrained(checkpoint)
    assert len(list(checkpoint.glob("model-*.safetensors"))) >= 3 and (checkpoint / "model.safetensors.index.json").exists()
    out = _streamed(checkpoint, tmp_path / "out")
    batch = tokenizer(["the cat sat on the mat", "a dog"], return_tensors="pt", padding=True, return_token_type_ids=False)
    options = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    expected = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval().generate(**batch, **options)
    got = ORTModelForCausalLM.from_pretrained(out).generate(**batch, **options)
    assert got.tolist() == expected.tolist()


@pytest.mark.skipif(not hasattr(__import__("transformers"), "Gemma4ForConditionalGeneration"),
                    reason="gemma4 is new in transformers 5.24")
def test_a_model_reading_its_embedding_outside_its_forward_streams(tmp_path):
    """Gemma 4's forward takes its pad token's row of the input embedding itself (not through the embedding's
    forward, where the offload hook loads it): the embedding is kept in memory and the capture runs again while
    the rest streams, and ORTModelForCausalLM gives PyTorch's logits (1e-4) and greedy tokens on a left-padded batch
    of two."""
    from optimum.onnxruntime import ORTModelForCausalLM
    from transformers import AutoModelForCausalLM, GenerationConfig

    import zoo
    from parity import assert_causal_lm_parity, padded_batch
    from tiny import tiny_tokenizer

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(zoo.tiny_config("gemma4")).eval()
    model.generation_config = GenerationConfig(pad_token_id=0, bos_token_id=1, eos_token_id=2)
    checkpoint = tmp_path / "gemma4"
    model.save_pretrained(checkpoint)
    tokenizer = tiny_tokenizer(zoo.TINY["vocab_size"])
    tokenizer.save_pretrained(checkpoint)
    run = _cli("--model", checkpoint, "--task", TASK, tmp_path / "out", stream="1")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "reads its input embedding outside the embedding's forward: kept in memory (" in run.stderr
    assert_causal_lm_parity(ORTModelForCausalLM.from_pretrained(tmp_path / "out"), model, padded_batch(tokenizer))


@pytest.mark.once("t4")
def test_an_invalid_switch_is_refused_in_one_line(checkpoints, tmp_path):
    run = _cli("--model", checkpoints("llama"), tmp_path / "out", stream="maybe")
    errors = [line for line in run.stderr.splitlines() if "error" in line]
    assert run.returncode == 1 and errors == [
        f"optimum-cli export onnx --dynamo: error: invalid {streaming.ENV}='maybe': expected 1 or 0"], run.stderr[-2000:]
    assert not (tmp_path / "out").exists()


@pytest.mark.once("t5")  # CI: a refusal of ours, in one environment (make test-all: both)
def test_pt2_is_refused_when_the_weights_are_streamed(checkpoints, tmp_path):
    """A .pt2 program carries the weights from memory: with them left in the checkpoint it would hold garbage."""
    run = _cli("--model", checkpoints("llama"), "--pt2", tmp_path / "out", stream="1")
    errors = [line for line in run.stderr.splitlines() if "error" in line]
    assert run.returncode == 1 and errors == [
        "optimum-cli export onnx --dynamo: error: --pt2/--aoti write the weights from memory: this model's are "
        f"streamed from the checkpoint (docs: Big models); drop --pt2/--aoti or set {streaming.ENV}=0"], run.stderr[-2000:]
    assert not (tmp_path / "out").exists()


def test_small_checkpoints_are_not_streamed_by_default(checkpoints, monkeypatch):
    """The automatic choice reads the checkpoint's safetensors headers (nothing loaded): a tiny model is far
    below half of any machine's memory and below the size that streams."""
    from safetensors.torch import load_file

    monkeypatch.delenv(streaming.ENV, raising=False)
    checkpoint = checkpoints("llama")
    assert streaming.checkpoint_parameters(str(checkpoint)) == {
        "F32": sum(t.numel() for t in load_file(checkpoint / "model.safetensors").values())}
    assert streaming.available_memory() > 0
    assert not streaming.wanted(streaming.export_bytes(str(checkpoint), torch.float32))


def _declared(path: Path, tensors: dict[str, tuple[str, int]]) -> None:
    """A safetensors file whose header declares `tensors` (name -> (dtype, elements)): its data a sparse hole,
    no disk taken."""
    size = {"F32": 4, "BF16": 2, "F16": 2}
    header, offset = {}, 0
    for name, (dtype, count) in tensors.items():
        header[name] = {"dtype": dtype, "shape": [count], "data_offsets": [offset, offset + count * size[dtype]]}
        offset += count * size[dtype]
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text)
        f.truncate(8 + len(text) + offset)


def test_the_size_of_the_export_dtype_weights_decides(tmp_path, monkeypatch):
    """From 1 GiB of weights in the export dtype they stream by default; counted over the index's shards only
    (Mistral's repositories also ship consolidated.safetensors)."""
    monkeypatch.delenv(streaming.ENV, raising=False)
    _declared(tmp_path / "model-00001-of-00002.safetensors", {"a": ("BF16", 200_000_000)})
    _declared(tmp_path / "model-00002-of-00002.safetensors", {"b": ("BF16", 100_000_000), "c": ("F32", 10)})
    _declared(tmp_path / "consolidated.safetensors", {"a": ("BF16", 300_000_000)})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors",
        "c": "model-00002-of-00002.safetensors"}}))
    assert streaming.checkpoint_parameters(str(tmp_path)) == {"BF16": 300_000_000, "F32": 10}
    assert streaming.export_bytes(str(tmp_path), torch.float32) == 1_200_000_040 >= streaming.SIZE
    assert streaming.wanted(streaming.export_bytes(str(tmp_path), torch.float32))
    assert not streaming.wanted(streaming.export_bytes(str(tmp_path), torch.float16))  # 600 MB
    monkeypatch.setenv(streaming.ENV, "0")
    assert not streaming.wanted(streaming.export_bytes(str(tmp_path), torch.float32))
    (tmp_path / "model-00002-of-00002.safetensors").unlink()  # a partial download: not counted from what is there
    assert streaming.weight_files(tmp_path) == []


def test_a_hub_id_is_counted_from_its_cached_snapshot(checkpoints, tmp_path, monkeypatch):
    """A hub id the cache holds is read as its snapshot directory (offline here); one whose snapshot has only its
    config (what the export reads first) is asked of the hub, which offline gives nothing: in memory."""
    from tiny import cache_snapshot

    monkeypatch.delenv(streaming.ENV, raising=False)
    checkpoint = checkpoints("llama")
    cached = {"tiny-org/llama": sorted(checkpoint.iterdir()), "tiny-org/config-only": [checkpoint / "config.json"]}
    for repo, files in cached.items():
        cache_snapshot(tmp_path, repo, files)
    hub = {"cache_dir": str(tmp_path)}
    assert streaming.checkpoint_parameters("tiny-org/llama", hub) == streaming.checkpoint_parameters(str(checkpoint))
    assert streaming.local_checkpoint("tiny-org/config-only", hub) is not None
    assert streaming.checkpoint_parameters("tiny-org/config-only", hub) == {}
    assert streaming.checkpoint_parameters("tiny-org/absent", hub) == {}


def test_a_state_space_model_the_size_would_stream_loads_in_memory(tmp_path, monkeypatch, caplog):
    """The size chose streaming (lowered here to 0 bytes), but streaming does not cover state-space models:
    mamba loads in memory, says so, and exports as it does without streaming."""
    import logging

    from optimum_dynamo import export_onnx
    from tiny import save_tiny_decoder

    monkeypatch.delenv(streaming.ENV, raising=False)
    monkeypatch.setattr(streaming, "SIZE", 0)
    checkpoint = save_tiny_decoder("mamba", tmp_path / "mamba")
    with caplog.at_level(logging.INFO):
        ctx = export_onnx(str(checkpoint), tmp_path / "out", task="text-generation-with-past")
    assert not ctx.streamed
    assert "    weights loaded in memory: streaming does not cover state-space models yet" in caplog.messages
    assert not any(STREAMED in m for m in caplog.messages)
    assert (tmp_path / "out" / "model.onnx").exists()


@pytest.mark.once("t4")
def test_pt2_of_a_model_the_size_would_stream_loads_in_memory(checkpoints, tmp_path, monkeypatch, caplog):
    """--pt2 writes the program's weights from memory: when only the size chose streaming (lowered here to 0
    bytes) and the weights fit, they load in memory, as before streaming was the default."""
    import logging

    from optimum_dynamo import export_onnx

    monkeypatch.delenv(streaming.ENV, raising=False)
    monkeypatch.setattr(streaming, "SIZE", 0)
    with caplog.at_level(logging.INFO):
        ctx = export_onnx(str(checkpoints("llama")), tmp_path / "out", task=TASK, pt2=True)
    assert not ctx.streamed
    assert "    weights loaded in memory: --pt2/--aoti write the weights from memory" in caplog.messages
    assert list((tmp_path / "out").glob("*.pt2"))


@pytest.mark.once("t4")
@pytest.mark.parametrize("model_type", ["bert", pytest.param("vit", marks=pytest.mark.slow)])  # the same loader
def test_a_non_generative_task_streams_to_the_same_bytes(bare_checkpoints, bare_exports, tmp_path, model_type):
    """Encoders from 1 GiB (e5-large, bge-m3) stream by default through the same loader: a fill-mask and an
    image-classification export give the bytes of the export with the weights in memory."""
    from conftest import BARE

    run = _cli("--no-fallback", "--model", bare_checkpoints(model_type), "--task", BARE[model_type][0],
               tmp_path / "out", stream="1")
    assert run.returncode == 0 and STREAMED in run.stderr, run.stderr[-3000:]
    names = sorted(p.name for p in bare_exports(model_type).glob("model.onnx*"))
    assert names == sorted(p.name for p in (tmp_path / "out").glob("model.onnx*"))
    for name in names:
        assert (tmp_path / "out" / name).read_bytes() == (bare_exports(model_type) / name).read_bytes(), name


def test_cli_export_in_memory_still_needs_no_switch(dynamo_exports):
    """The default path is unchanged: no streaming line, no `weights` field."""
    manifest = json.loads((dynamo_exports("llama") / "optimum_dynamo.json").read_text())
    assert "weights" not in manifest



@pytest.mark.once("t4")  # CI: a refusal of ours, in one environment (make test-all: both)
def test_a_state_space_model_is_refused_in_one_line(tmp_path):
    """Mamba's cache is made on the model's device, the meta device when the weights stream: refused, not traced."""
    from tiny import save_tiny_decoder

    run = _cli("--model", save_tiny_decoder("mamba", tmp_path / "mamba"), tmp_path / "out", stream="1")
    errors = [line for line in run.stderr.splitlines() if "error" in line]
    assert run.returncode == 1 and errors == [
        "optimum-cli export onnx --dynamo: error: mamba: streaming the weights does not cover state-space models yet "
        f"(docs: Big models); set {streaming.ENV}=0 to export with the weights in memory"], run.stderr[-2000:]
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".optimum-dynamo-*"))
