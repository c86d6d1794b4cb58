"""optimum-dynamo's options on optimum's parsers never collide with optimum's own: an option optimum defines
is taken over (`--dynamo`) or left to optimum, and every collision with the parsers of the optimum-onnx
versions users have (the installed release, and the main branch its next release comes from, from
../shared/vendor) is one this package declares. A new upstream flag that collides fails here, not for users."""

import argparse
import importlib.util
import tarfile
from pathlib import Path

import pytest

from optimum_dynamo.cli import executorch, onnx
from optimum_dynamo.cli.arguments import Option, add_options, collisions

VENDOR = Path(__file__).resolve().parents[2] / "shared" / "vendor"


def _main_parse_args_onnx(tmp_path):
    """`parse_args_onnx` of optimum-onnx's main branch, read from the snapshot (the installed release stays)."""
    snapshots = sorted(VENDOR.glob("optimum-onnx-main-*.tar.gz"))
    if not snapshots:
        pytest.skip(f"no optimum-onnx main snapshot in {VENDOR}")
    with tarfile.open(snapshots[-1]) as archive:
        member = next(m for m in archive.getmembers() if m.name.endswith("optimum/commands/export/onnx.py"))
        (tmp_path / "main_onnx.py").write_bytes(archive.extractfile(member).read())
    spec = importlib.util.spec_from_file_location("optimum_onnx_main_cli", tmp_path / "main_onnx.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.parse_args_onnx


def _installed_parse_args_onnx(tmp_path):
    from optimum.commands.export.onnx import parse_args_onnx  # the module function: never wrapped

    return parse_args_onnx


def _undeclared(found: dict, options) -> dict:
    taken_over = {"/".join(o.strings) for o in options if o.take_over}
    return {name: strings for name, strings in found.items() if name not in taken_over}


@pytest.mark.parametrize("version", ["installed", "main"])
def test_export_onnx_options_collide_only_where_declared(version, tmp_path):
    build = (_installed_parse_args_onnx if version == "installed" else _main_parse_args_onnx)(tmp_path)
    found = collisions(build, onnx.OPTIONS)
    assert _undeclared(found, onnx.OPTIONS) == {}
    if version == "main":  # the check sees a real collision: main defines its own --dynamo
        assert found == {"--dynamo": ["--dynamo"]}


def test_export_executorch_options_collide_only_where_declared():
    if importlib.util.find_spec("optimum.commands.export.executorch") is None:
        pytest.skip("optimum-executorch is not installed")
    from optimum.commands.export.executorch import parse_args_executorch

    assert _undeclared(collisions(parse_args_executorch, executorch.OPTIONS), executorch.OPTIONS) == {}


def test_on_mains_parser_dynamo_is_ours_and_defined_once(tmp_path):
    parser = argparse.ArgumentParser()
    _main_parse_args_onnx(tmp_path)(parser)
    add_options(parser, onnx.OPTIONS)
    parse = lambda *extra: parser.parse_args(["--model", "m", "out", *extra]).dynamo  # noqa: E731
    assert (parse(), parse("--dynamo"), parse("--no-dynamo")) == (None, True, False)
    listed = [line for line in parser.format_help().splitlines() if line.strip().startswith("--dynamo")]
    assert listed == ["  --dynamo, --no-dynamo"]


def test_an_option_optimum_defines_is_left_to_optimum():
    """A parser that already has `-v` (for something else) and `--pt2`: nothing raises, optimum's own
    definitions stay, our free spellings are added."""
    parser = argparse.ArgumentParser()
    parser.add_argument("-v", dest="version_flag", action="store_true")
    parser.add_argument("--pt2", type=int, default=7)
    add_options(parser, [Option(("-v", "--verbose"), dict(action="store_true")),
                         Option(("--pt2",), dict(action="store_true"))])
    args = parser.parse_args(["-v", "--verbose", "--pt2", "3"])
    assert (args.version_flag, args.verbose, args.pt2) == (True, True, 3)
