"""The fault matrix (docs/reliability.md): every failing row ends with one error line, a non-zero exit,
no output, no staging dir and the checkpoint unchanged. CLI rows run the real optimum-cli."""

import hashlib
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import transformers
from conftest import optimum_cli

from optimum_dynamo.staging import PREFIX

PROGRAM = "optimum-cli export onnx --dynamo: error: "
# Faults of the process and the file system (a signal, a full disk, a file-size limit, a killed run's staging): the same
# code whatever transformers and torch. CI runs them with transformers 4 (T4); with 5 they are under `slow`.
PROCESS_FAULT = pytest.mark.slow if transformers.__version__ >= "5" else pytest.mark.usefixtures()


def tree_hash(path: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in Path(path).rglob("*") if p.is_file()):
        h.update(str(f.relative_to(path)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in Path(parent).iterdir() if p.name.startswith(PREFIX)) if Path(parent).exists() else []


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "error" in line.lower()]


def assert_refused(run, out: Path, message: str, *, before_load: bool = False):
    """One line `PROGRAM + ...message...`, non-zero exit, no traceback, no output, no staging dir."""
    assert run.returncode != 0, run.stderr[-2000:]
    lines = error_lines(run.stderr)
    assert len(lines) == 1 and lines[0].startswith(PROGRAM) and message in lines[0], run.stderr[-2000:]
    assert "Traceback" not in run.stderr
    if before_load:
        assert "[1/" not in run.stderr, "refused only after the export started"
    if not Path(out).is_file():
        assert not Path(out).exists()
    assert leftovers(Path(out).parent) == []


@pytest.fixture
def llama(checkpoints, tmp_path):
    """A private copy of the tiny llama (rows may damage it) and its hash."""
    path = tmp_path / "llama"
    shutil.copytree(checkpoints("llama"), path)
    return path


def _edit_config(path: Path, **changes):
    data = json.loads((path / "config.json").read_text())
    data.update(changes)
    (path / "config.json").write_text(json.dumps(data))


# ── bad checkpoints ──
def _corrupt_config(p):
    (p / "config.json").write_text("{ not json")


def _missing_config(p):
    (p / "config.json").unlink()


def _wrong_model_type(p):
    _edit_config(p, model_type="no-such-model")


def _truncated_weights(p):
    f = p / "model.safetensors"
    os.truncate(f, f.stat().st_size // 2)


def _missing_weights(p):
    (p / "model.safetensors").unlink()


def _sharded(p: Path) -> list[Path]:
    """Re-save the checkpoint as two shards and an index, as big checkpoints come; return the shards."""
    from safetensors.numpy import load_file, save_file

    tensors = load_file(p / "model.safetensors")
    keys = sorted(tensors)
    shards = [p / f"model-0000{i}-of-00002.safetensors" for i in (1, 2)]
    for shard, part in zip(shards, (keys[: len(keys) // 2], keys[len(keys) // 2:])):
        save_file({k: tensors[k] for k in part}, shard, metadata={"format": "pt"})
    index = {"metadata": {"total_size": sum(t.nbytes for t in tensors.values())},
             "weight_map": {k: shards[i >= len(keys) // 2].name for i, k in enumerate(keys)}}
    (p / "model.safetensors.index.json").write_text(json.dumps(index))
    (p / "model.safetensors").unlink()
    return shards


def _missing_shard(p):
    _sharded(p)[1].unlink()


def _truncated_shard(p):
    shard = _sharded(p)[0]
    os.truncate(shard, shard.stat().st_size // 2)


def _shape_mismatch(p):
    _edit_config(p, intermediate_size=json.loads((p / "config.json").read_text())["intermediate_size"] * 2)


# each damage in one environment in CI (the loading code is ours; make test-all: both)
@pytest.mark.parametrize("damage, message", [pytest.param(*row, marks=pytest.mark.once(env)) for *row, env in [
    (_corrupt_config, "cannot load", "t4"),
    (_missing_config, "no config.json in it", "t5"),
    (_wrong_model_type, "cannot load", "t5"),
    (_truncated_weights, "cannot load weights", "t4"),
    (_missing_weights, "cannot load weights", "t5"),
    (_shape_mismatch, "cannot load weights", "t4"),
    (_missing_shard, "cannot load weights", "t5"),
    (_truncated_shard, "cannot load weights", "t4"),
]], ids=lambda x: getattr(x, "__name__", "")[1:] if callable(x) else None)
def test_bad_checkpoint(llama, tmp_path, damage, message):
    damage(llama)
    before = tree_hash(llama)
    out = tmp_path / "out"
    run = optimum_cli("export", "onnx", "--dynamo", "--model", llama, "--task", "text-generation-with-past", out)
    assert_refused(run, out, message)
    assert "falling back" not in run.stderr  # a broken checkpoint is the user's to fix, not the fallback's
    assert tree_hash(llama) == before


@pytest.mark.parametrize("option, message", [
    (["--atol", "-1"], "invalid --atol -1.0"),
    (["--atol", "nan"], "invalid --atol nan"),
    (["--opset", "12"], "invalid --opset 12"),
    (["--opset", "99"], "invalid --opset 99"),
])
def test_invalid_option_values_are_refused_before_any_work(checkpoints, tmp_path, option, message):
    out = tmp_path / "out"
    run = optimum_cli("export", "onnx", "--dynamo", "--model", checkpoints("llama"), *option, out)
    assert_refused(run, out, message, before_load=True)


@pytest.mark.parametrize("args, shown", [
    (["export", "onnx", "--dynamo", "--model", "CKPT", "--atol", "-1", "OUT"], PROGRAM + "invalid --atol -1.0"),
    (["export", "--help"], "executorch"),  # listed, its package (transformers.pipelines: seconds) not imported
])
def test_refusals_and_help_import_no_torch(checkpoints, tmp_path, args, shown):
    exe = Path(sys.executable).parent / "optimum-cli"
    args = [str(checkpoints("llama")) if a == "CKPT" else str(tmp_path / "out") if a == "OUT" else a for a in args]
    run = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"})
    imported = {line.rsplit("|", 1)[1].strip() for line in run.stderr.splitlines() if line.startswith("import time:")}
    assert "optimum_dynamo" in imported and shown in run.stdout + run.stderr, run.stderr[-2000:]
    assert not imported & {"torch", "transformers", "optimum.commands.export.executorch"}


def test_output_path_is_a_file(checkpoints, tmp_path):
    out = tmp_path / "model.onnx"
    out.write_text("mine")
    run = optimum_cli("export", "onnx", "--dynamo", "--model", checkpoints("llama"), out)
    assert_refused(run, out, f"output {out} exists and is not a directory", before_load=True)
    assert out.read_text() == "mine"


@pytest.mark.once("t4")  # CI: a refusal of ours, in one environment (make test-all: both)
def test_unwritable_output_location(checkpoints):
    out = Path("/proc/optimum-dynamo-test/out")  # not creatable, even by root
    run = optimum_cli("export", "onnx", "--dynamo", "--model", checkpoints("llama"), out)
    assert run.returncode != 0 and "Traceback" not in run.stderr
    lines = error_lines(run.stderr)
    assert len(lines) == 1 and lines[0].startswith(PROGRAM + f"cannot create {out}"), run.stderr[-2000:]


# ── remote code ──
def _remote_code_checkpoint(llama: Path, marker: Path) -> Path:
    """The llama, but its config and model classes come from a module of the checkpoint (auto_map)
    that writes `marker` when it is imported."""
    (llama / "modeling_marker.py").write_text(
        "import pathlib\n"
        f"pathlib.Path({str(marker)!r}).write_text('imported')\n"
        "from transformers import LlamaConfig, LlamaForCausalLM\n\n\n"
        "class MarkerConfig(LlamaConfig):\n    model_type = 'marker-llama'\n\n\n"
        "class MarkerForCausalLM(LlamaForCausalLM):\n    config_class = MarkerConfig\n"
    )
    _edit_config(llama, model_type="marker-llama", architectures=["MarkerForCausalLM"],
                 auto_map={"AutoConfig": "modeling_marker.MarkerConfig",
                           "AutoModelForCausalLM": "modeling_marker.MarkerForCausalLM"})
    return llama


@pytest.mark.once("t4")  # CI: a refusal of ours, in one environment (make test-all: both)
def test_remote_code_is_refused_without_trust_remote_code(llama, tmp_path):
    marker = tmp_path / "marker"
    _remote_code_checkpoint(llama, marker)
    before, out = tree_hash(llama), tmp_path / "out"
    run = optimum_cli("export", "onnx", "--dynamo", "--model", llama, "--task", "text-generation-with-past", out)
    assert_refused(run, out, "contains custom code: read it, then pass --trust-remote-code to run it")
    assert not marker.exists(), "the checkpoint's code was imported"
    assert tree_hash(llama) == before


@pytest.mark.slow
def test_remote_code_runs_with_trust_remote_code(llama, tmp_path):
    marker = tmp_path / "marker"
    _remote_code_checkpoint(llama, marker)
    out = tmp_path / "out"
    run = optimum_cli("export", "onnx", "--dynamo", "--trust-remote-code", "--model", llama,
                      "--task", "text-generation-with-past", out)
    assert run.returncode == 0, run.stderr[-3000:]
    assert marker.read_text() == "imported"
    assert json.loads((out / "optimum_dynamo.json").read_text())["exporter"] == "dynamo"


# ── leftovers, existing output, file-size limit ──
_HOLD_STAGING = """
import sys, time
from pathlib import Path
from optimum_dynamo.staging import staged
with staged(Path(sys.argv[1])) as staging:
    (staging / "model.onnx_data").write_bytes(b"partial")
    print(staging, flush=True)
    time.sleep(600)
"""


def _hold_staging(out: Path) -> subprocess.Popen:
    """A process that owns a staging dir beside `out` until it is killed; returns it once the dir exists."""
    proc = subprocess.Popen([sys.executable, "-c", _HOLD_STAGING, str(out)], stdout=subprocess.PIPE, text=True)
    proc.staging = Path(proc.stdout.readline().strip())
    assert proc.staging.is_dir()
    return proc


@PROCESS_FAULT
def test_stale_staging_of_a_killed_run_is_removed_not_a_live_one(checkpoints, tmp_path):
    """A run killed with SIGKILL leaves its staging dir; the next export beside it removes it, keeps the
    one of a live run and the user's files in the existing output dir (the overwrite rule)."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "README.md").write_text("user notes")
    (out / "model.onnx").write_text("an old export")
    dead, live = _hold_staging(out), _hold_staging(out)
    dead.kill()
    dead.wait()
    try:
        assert dead.staging.is_dir()  # SIGKILL: nothing could clean up
        run = optimum_cli("export", "onnx", "--dynamo", "--model", checkpoints("llama"), out)
        assert run.returncode == 0, run.stderr[-3000:]
        assert not dead.staging.exists()
        assert live.staging.is_dir() and (live.staging / "model.onnx_data").read_bytes() == b"partial"
        assert leftovers(tmp_path) == [live.staging.name]
        assert (out / "README.md").read_text() == "user notes"  # files the export does not write are kept
        assert (out / "model.onnx").read_bytes() != b"an old export"  # files it writes are replaced
        assert json.loads((out / "optimum_dynamo.json").read_text())["exporter"] == "dynamo"
    finally:
        live.kill()
        live.wait()


def _limit_file_size(limit: int):
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


@PROCESS_FAULT
def test_file_size_limit_while_saving(checkpoints, tmp_path):
    out = tmp_path / "out"
    before = tree_hash(checkpoints("llama"))
    exe = Path(sys.executable).parent / "optimum-cli"
    run = subprocess.run([str(exe), "export", "onnx", "--dynamo", "--model", str(checkpoints("llama")), str(out)],
                         capture_output=True, text=True, timeout=900, preexec_fn=_limit_file_size(64 * 1024))
    assert_refused(run, out, f"cannot write the export to {tmp_path}: ")
    assert "file-size limit is 65536 bytes" in run.stderr or "File too large" in run.stderr
    assert re.search(r"\[\d+/\d+\] save", run.stderr)
    assert tree_hash(checkpoints("llama")) == before


def _sparse_big_checkpoint(path: Path) -> Path:
    """A tiny llama whose embedding (tied to the head) is 64 GB: a sparse safetensors file, 64 GB to the
    kernel, a few KB on disk (zeros)."""
    import struct

    from safetensors import safe_open
    from tiny import save_tiny_decoder

    checkpoint = save_tiny_decoder("llama", path, tie_word_embeddings=True)
    weights = checkpoint / "model.safetensors"
    with safe_open(str(weights), "np") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys() if "embed_tokens" not in k}
        embed = next(k for k in f.keys() if "embed_tokens" in k)
    config = json.loads((checkpoint / "config.json").read_text())
    config["vocab_size"] = 2**36 // (4 * config["hidden_size"])
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for key, array in tensors.items():
        header[key] = {"dtype": "F32", "shape": list(array.shape), "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    header[embed] = {"dtype": "F32", "shape": [config["vocab_size"], config["hidden_size"]],
                     "data_offsets": [offset, offset + 2**36]}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(weights, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for array in tensors.values():
            f.write(array.astype("<f4").tobytes())
        f.truncate(8 + len(text) + offset + 2**36)
    (checkpoint / "config.json").write_text(json.dumps(config))
    return checkpoint


@pytest.mark.once("t5")  # CI: a refusal of ours, in one environment (make test-all: both)
def test_out_of_memory_names_the_stage_and_does_not_fall_back(tmp_path):
    """A checkpoint bigger than the process may map (address space capped at 16 GB; the weights are 64 GB):
    one line naming the stage that ran out, not "cannot load weights" (the checkpoint is fine), and no
    torchscript fallback (it needs more memory, not less)."""
    checkpoint = _sparse_big_checkpoint(tmp_path / "big")
    files = lambda: {f.name: (f.stat().st_size, f.stat().st_mtime_ns) for f in checkpoint.iterdir()}  # 64 GB: not read
    before, out = files(), tmp_path / "out"
    exe = Path(sys.executable).parent / "optimum-cli"
    cap = 16 * 2**30
    run = subprocess.run([str(exe), "export", "onnx", "--dynamo", "--model", str(checkpoint), str(out)],
                         capture_output=True, text=True, timeout=900,
                         preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (cap, cap)))
    assert_refused(run, out, "out of memory in stage [1/")
    line = error_lines(run.stderr)[0]
    assert re.fullmatch(re.escape(PROGRAM) + r"out of memory in stage \[1/\d+\] load model \(.+\): the export needs "
                        r"more memory than this process may use \(docs: Big models\)", line), line
    assert "falling back" not in run.stderr
    assert files() == before


@pytest.fixture
def small_disk(tmp_path):
    """A 400 KB tmpfs: a tiny llama's graph (~340 KB) fits, not its weights beside it (root can mount one here and in
    CI; elsewhere the test is skipped)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


@PROCESS_FAULT
def test_disk_full_while_saving(checkpoints, small_disk):
    """The export does not fit the disk: one line naming the full disk, nothing left on it. (Where the writer
    drops the errno, numpy's `tofile` on big weights, the free space is measured before the cleanup frees it:
    an 8B export filling this machine's disk said `OSError: 1835008 requested and 520192 written` before.)"""
    out = small_disk / "out"
    run = optimum_cli("export", "onnx", "--dynamo", "--model", checkpoints("llama"), out)
    assert_refused(run, out, f"cannot write the export to {small_disk}: ")
    assert os.strerror(28) in error_lines(run.stderr)[0]  # ENOSPC
    assert list(small_disk.iterdir()) == []


# ── interrupts ──
def _interrupt(model: Path, out: Path, at_line: str, signum: int):
    exe = Path(sys.executable).parent / "optimum-cli"
    # as from a terminal: a job started with `&` by a non-interactive shell (CI) ignores SIGINT, and a Python
    # started with SIGINT ignored keeps ignoring it (the export would rightly run to the end)
    proc = subprocess.Popen([str(exe), "export", "onnx", "--dynamo", "--model", str(model), str(out)],
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if at_line in line:
            proc.send_signal(signum)
            break
    rest = proc.communicate(timeout=600)[1]
    return proc.returncode, "".join(seen) + rest


@PROCESS_FAULT
@pytest.mark.parametrize("signum, at_line", [
    (signal.SIGINT, "torch.export"),
    pytest.param(signal.SIGTERM, "torch.export", marks=pytest.mark.slow),
    pytest.param(signal.SIGINT, "] save", marks=pytest.mark.slow),
    pytest.param(signal.SIGTERM, "] save", marks=pytest.mark.slow),
], ids=["SIGINT-export", "SIGTERM-export", "SIGINT-save", "SIGTERM-save"])
def test_interrupt(checkpoints, tmp_path, signum, at_line):
    out = tmp_path / "out"
    before = tree_hash(checkpoints("llama"))
    code, stderr = _interrupt(checkpoints("llama"), out, at_line, signum)
    expected = {signal.SIGINT: (130, "KeyboardInterrupt"), signal.SIGTERM: (143, "Terminated")}[signum]
    assert code == expected[0], stderr[-3000:]
    assert error_lines(stderr) == [f"{PROGRAM}interrupted ({expected[1]}); nothing was written"], stderr[-3000:]
    assert "Traceback" not in stderr
    assert not out.exists() and leftovers(tmp_path) == []
    assert tree_hash(checkpoints("llama")) == before


@pytest.mark.slow
def test_sigkill_during_export_then_a_new_export(checkpoints, tmp_path):
    out = tmp_path / "out"
    exe = Path(sys.executable).parent / "optimum-cli"
    proc = subprocess.Popen([str(exe), "export", "onnx", "--dynamo", "--model", str(checkpoints("llama")), str(out)],
                            stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        if "torch.export" in line:
            proc.kill()
            break
    proc.wait()
    assert len(leftovers(tmp_path)) == 1
    run = optimum_cli("export", "onnx", "--dynamo", "--model", checkpoints("llama"), out)
    assert run.returncode == 0, run.stderr[-3000:]
    assert leftovers(tmp_path) == []


# ── concurrency ──
@pytest.mark.slow
def test_two_processes_one_output_dir(checkpoints, tmp_path):
    import onnxruntime as ort

    out = tmp_path / "out"
    exe = Path(sys.executable).parent / "optimum-cli"
    procs = [subprocess.Popen([str(exe), "export", "onnx", "--dynamo", "--model", str(checkpoints(m)),
                               "--task", "text-generation-with-past", str(out)], stderr=subprocess.PIPE, text=True)
             for m in ("llama", "gpt2")]
    for p in procs:
        assert p.wait(timeout=900) == 0, p.stderr.read()[-3000:]
    manifest = json.loads((out / "optimum_dynamo.json").read_text())
    config = json.loads((out / "config.json").read_text())
    assert manifest["model"].endswith(config["model_type"])  # one run's files, not a mix
    session = ort.InferenceSession(str(out / "model.onnx"))
    assert [i.name for i in session.get_inputs()] == manifest["inputs"]
    assert leftovers(tmp_path) == []


@pytest.mark.slow
def test_two_threads_export_one_after_the_other(checkpoints, tmp_path):
    from optimum_dynamo import export_onnx

    results, errors = {}, []

    def run(model_type):
        try:
            results[model_type] = export_onnx(checkpoints(model_type), tmp_path / model_type,
                                              task="text-generation-with-past", atol=1e-4)
        except BaseException as e:  # noqa: BLE001  (reported below)
            errors.append(e)

    threads = [threading.Thread(target=run, args=(m,)) for m in ("llama", "gpt2")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for model_type, ctx in results.items():  # validated against its own model within atol
        manifest = json.loads((tmp_path / model_type / "optimum_dynamo.json").read_text())
        assert manifest["model"] == str(checkpoints(model_type))
        assert max(d["max_abs"] for d in manifest["discrepancies"]) < 1e-4


# ── Python API: same rows, state restored in the same process ──
def _process_state():
    """What an export changes while it runs: patched attributes, and our cache classes' pytree nodes."""
    import optree
    from torch.utils import _pytree

    from optimum_dynamo.flatten.registry import kinds
    from optimum_dynamo.patches.registry import active_patches

    patched = {}
    for patch in active_patches():
        try:
            owner, attr = patch.resolve()
            patched[patch.target] = getattr(owner, attr)
        except Exception:  # noqa: BLE001  (a target missing here is missing before and after alike)
            patched[patch.target] = None
    caches = [cls for cls in (k.resolve() for k in kinds()) if cls is not None]
    nodes = {cls: (_pytree.SUPPORTED_NODES.get(cls), optree.register_pytree_node.get(cls, namespace="torch"))
             for cls in caches}
    return patched, nodes


@pytest.mark.parametrize("options, message", [
    ({"atol": -1.0}, "invalid --atol"),
    ({"opset": 7}, "invalid --opset"),
    ({"atol": 1e-30}, "differs from PyTorch"),  # fails after torch.export, translation and save
])
def test_python_api_failure_restores_process_state(checkpoints, tmp_path, options, message):
    from optimum_dynamo import export_onnx
    from optimum_dynamo.errors import ExportError

    before = _process_state()
    out = tmp_path / "out"
    with pytest.raises(ExportError, match=message):
        export_onnx(checkpoints("llama"), out, task="text-generation-with-past", **options)
    assert _process_state() == before
    assert not out.exists() and leftovers(tmp_path) == []
