"""The `torch.export` program beside an ONNX export: `model.pt2` (`--pt2`, read back by `torch.export.load`)
and an AOTInductor package `model_aoti.pt2` (`--aoti`, compiled C++ that `aoti_load_package` runs without the
model's Python code). Both take and return what the model's forward does (a `DynamicCache` as
`past_key_values`): the cache classes must be pytree nodes when they are loaded and called, which
`load_program` / `load_package` do (the registration stays for the process; `flatten.unregister()` undoes it).
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path

import torch

from ..errors import ExportError
from ..flatten import flat_outputs, register

logger = logging.getLogger(__name__)
PT2_FILE = "model.pt2"
AOTI_FILE = "model_aoti.pt2"


def load_program(path: str | Path) -> torch.export.ExportedProgram:
    """A saved `model.pt2` (a file, or an export directory holding one), with the cache classes registered.
    Run it as `program.module(check_guards=False)(**kwargs)`: it was traced size-obliviously, like the ONNX
    graph, so a batch or sequence of 1 is valid although its recorded guards say otherwise."""
    register()
    return _read_program(path)


def _read_program(path: str | Path) -> torch.export.ExportedProgram:
    path = Path(path)
    return torch.export.load(str(path / PT2_FILE if path.is_dir() else path))


def load_package(path: str | Path):
    """A saved AOTInductor package (a file, or an export directory holding `model_aoti.pt2`), callable with the
    forward's keyword arguments; the cache classes registered."""
    register()
    return _read_package(path)


def _read_package(path: str | Path):
    from torch._inductor import aoti_load_package

    path = Path(path)
    return aoti_load_package(str(path / AOTI_FILE if path.is_dir() else path))


def empty_cache(config, batch_size: int = 1, dtype: torch.dtype = torch.float32):
    """The first step's `past_key_values` for a program exported from a decoder with a `DynamicCache`: one
    layer per hidden layer holding zero positions (the program takes the cache structure it was exported with)."""
    from transformers import DynamicCache

    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    cache = DynamicCache()
    for layer in range(text.num_hidden_layers):
        empty = torch.zeros(batch_size, kv_heads, 0, head_dim, dtype=dtype)
        cache.update(empty, empty.clone(), layer)
    return cache


def save_program(program: torch.export.ExportedProgram, directory: Path) -> str:
    torch.export.save(program, str(directory / PT2_FILE))
    return PT2_FILE


def compile_package(program: torch.export.ExportedProgram, directory: Path) -> str:
    from torch._inductor import aoti_compile_and_package

    aoti_compile_and_package(program, package_path=str(directory / AOTI_FILE))
    return AOTI_FILE


def max_difference(run, kwargs: dict, expected) -> float:
    """Largest |output - expected| of `run(**kwargs)` (caches deep-copied: running updates them)."""
    with torch.no_grad():
        got = run(**copy.deepcopy(kwargs))
    got, want = flat_outputs(got), flat_outputs(expected)
    if list(got) != list(want):
        raise ExportError(f"the reloaded program's outputs {list(got)} differ from the model's {list(want)}")
    return max((got[k].float() - want[k].float()).abs().max().item() for k in want)


def write_artifacts(program, model, kwargs: dict, directory: Path, *, pt2: bool, aoti: bool,
                    atol: float | None) -> dict[str, float]:
    """Write the requested files into `directory`, reload each and compare it with `model` on the export's
    sample `kwargs` (within `atol`, default 1e-4). Returns file -> max abs difference."""
    with torch.no_grad():
        expected = model(**copy.deepcopy(kwargs))
    # transformers' vmap-built masks leave a `flat_apply` node that the serializer refuses: an empty
    # decomposition table turns the program into plain aten ops (nothing else decomposed)
    program = program.run_decompositions({})
    limit = 1e-4 if atol is None else atol
    found = {}
    steps = [(save_program, _read_program, lambda p: p.module(check_guards=False))] if pt2 else []  # registered by the exporter
    steps += [(compile_package, _read_package, lambda p: p)] if aoti else []
    for write, load, runner in steps:
        name = write(program, directory)
        diff = max_difference(runner(load(directory / name)), kwargs, expected)
        logger.info("    %s: reloaded, max abs diff %.1e on the sample call", name, diff)
        if diff > limit:
            raise ExportError(f"{name} differs from PyTorch by {diff:.3e} > atol {limit:g} on the sample call")
        found[name] = diff
    return found


__all__ = ["AOTI_FILE", "PT2_FILE", "compile_package", "empty_cache", "load_package", "load_program", "save_program",
           "write_artifacts"]
