"""`optimum-cli export onnx` and `export executorch` both exist whatever was installed last.

optimum-onnx and optimum-executorch ship the same register file name; the package installed last overwrites the
other's. These tests install them in each order (a hard-linked copy of this environment, then `pip install
--force-reinstall --no-deps` of the package that comes last) and run the real `optimum-cli` of that copy.
"""

import importlib.metadata
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import optimum_cli

HAS_OPTIMUM_EXECUTORCH = importlib.util.find_spec("optimum.executorch") is not None
REGISTER = Path("lib") / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages" / "optimum" / \
    "commands" / "register" / "register_export.py"


def environment_with(last: str, root: Path) -> Path:
    """A copy of this environment in which `last` was installed after the other package."""
    env = root / "env"
    subprocess.run(["cp", "-al", sys.prefix, str(env)], check=True)
    pins = [f"{name}=={importlib.metadata.version(name)}" for name in (last, "optimum")]  # optimum: its script
    subprocess.run([str(env / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall",
                    *pins], check=True, capture_output=True)
    return env


def run_cli(env: Path, *args) -> subprocess.CompletedProcess:
    return subprocess.run([str(env / "bin" / "optimum-cli"), *map(str, args)], capture_output=True, text=True,
                          timeout=1200)


@pytest.mark.skipif(not HAS_OPTIMUM_EXECUTORCH, reason="optimum-executorch is installed in the T5 environment")
# optimum-onnx last is also how the T5 environment itself is installed (every CLI test runs that order)
@pytest.mark.parametrize("last", ["optimum-executorch", pytest.param("optimum-onnx", marks=pytest.mark.slow)])
def test_both_export_commands_whatever_the_install_order(last, checkpoints, tmp_path):
    env = environment_with(last, tmp_path)
    owner = "executorch" if last == "optimum-executorch" else "onnx"
    assert f"export.{owner} import" in (env / REGISTER).read_text()  # the other package's file is gone
    listed = run_cli(env, "export", "--help")
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert "{onnx,executorch}" in listed.stdout or "{executorch,onnx}" in listed.stdout, listed.stdout

    # each command reaches --dynamo's own checks (the exports themselves: every other CLI test, in this
    # environment's files, which the copy links)
    onnx = run_cli(env, "export", "onnx", "--dynamo", "--model", checkpoints("llama"), "--task", "text-dancing",
                   tmp_path / "onnx")
    assert onnx.returncode == 1
    last = onnx.stderr.strip().splitlines()[-1]
    assert last.startswith("optimum-cli export onnx --dynamo: error: ") and "unknown task 'text-dancing'" in last
    pte = run_cli(env, "export", "executorch", "--dynamo", "--model", checkpoints("llama"))
    assert pte.returncode == 1
    assert pte.stderr.strip().splitlines()[-1] == "optimum-cli export executorch --dynamo: error: --output_dir is required"
    shutil.rmtree(env)


REFUSED = [
    (["--qlinear", "8da4w"], "--qlinear quantization is not supported with --dynamo yet; drop it or export "
                             "without --dynamo"),
    (["--recipe", "coreml"], "--recipe coreml: only the xnnpack recipe is supported with --dynamo"),
    (["--task", "image-classification"], "--task image-classification: only text-generation is exported to "
                                         "ExecuTorch with --dynamo"),
    (["--dtype", "float16"], "--dtype float16: only float32 is exported to ExecuTorch with --dynamo yet"),
    (["--use_custom_sdpa"], "--use_custom_sdpa (ExecuTorch custom ops) is not supported with --dynamo; drop it "
                            "or export without --dynamo"),
]


@pytest.mark.parametrize("args,line", REFUSED, ids=[a[0] for a, _ in REFUSED])
def test_executorch_flags_refused_with_one_line(args, line, checkpoints, tmp_path):
    out = tmp_path / "out"
    run = optimum_cli("export", "executorch", "--dynamo", "--model", checkpoints("llama"), "--output_dir", out, *args)
    assert run.returncode == 1
    assert run.stderr.strip().splitlines()[-1] == f"optimum-cli export executorch --dynamo: error: {line}"
    assert not out.exists()


def test_executorch_command_without_output_dir(checkpoints):
    run = optimum_cli("export", "executorch", "--dynamo", "--model", checkpoints("llama"))
    assert run.returncode == 1
    assert run.stderr.strip().splitlines()[-1] == "optimum-cli export executorch --dynamo: error: --output_dir is required"


@pytest.mark.skipif(HAS_OPTIMUM_EXECUTORCH, reason="optimum-dynamo's own command: optimum-executorch not installed")
def test_own_executorch_command_refuses_no_dynamo(checkpoints, tmp_path):
    run = optimum_cli("export", "executorch", "--no-dynamo", "--model", checkpoints("llama"), "--output_dir",
                      tmp_path / "out")
    assert run.returncode == 1
    assert run.stderr.strip().splitlines()[-1] == (
        "optimum-cli export executorch --dynamo: error: --no-dynamo: optimum-executorch is not installed, "
        "optimum-dynamo is the only exporter of this command (pip install optimum-executorch, or drop --no-dynamo)")
