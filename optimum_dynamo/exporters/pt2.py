"""The `torch.export` program beside an ONNX export:

- `model.pt2` (`--pt2`): the program with the forward's own inputs and outputs (a `DynamicCache` as
  `past_key_values`), read back by `torch.export.load`; the cache classes must be pytree nodes when it is
  loaded and called, which `load_program` does (for the process; `flatten.unregister()` undoes it).
- `model_aoti.pt2` (`--aoti`): an AOTInductor package (compiled C++) on flat tensors, in the ONNX graph's
  input and output order and names (`input_ids, attention_mask, position_ids, past_key_values.0.key, ...` ->
  `logits, present.0.key, ...`): `torch._inductor.aoti_load_package` runs it without transformers or the
  model's code.

Both are traced again from the captured program's graph at the capture's sample: the graph has no Python
branch left, so none of the capture's guards on a batch or sequence of 1 (from tracing the model's code
size-obliviously) is recorded, and the program runs at any batch and sequence, past 0 included. Each file
is reloaded and run on every captured call before the export goes on (`--atol`, default 1e-4).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import torch

from ..flatten import flat_inputs, flat_outputs, register
from ..validate import compare, gate, references, table
from ..validate.report import rebuild_kwargs

logger = logging.getLogger(__name__)
PT2_FILE = "model.pt2"
AOTI_FILE = "model_aoti.pt2"
AOTI_IO = "model_aoti.json"  # the package's input and output names, in order
DEFAULT_ATOL = 1e-4


def load_program(path: str | Path) -> torch.export.ExportedProgram:
    """A saved `model.pt2` (a file, or an export directory holding one), with the cache classes registered.
    Run it as `program.module()(**kwargs)`."""
    register()
    path = Path(path)
    return torch.export.load(str(path / PT2_FILE if path.is_dir() else path))


def load_package(path: str | Path):
    """A saved AOTInductor package (a file, or an export directory holding `model_aoti.pt2`): called with the
    flat input tensors in `package_io(path)["inputs"]` order, it returns the flat outputs in `["outputs"]`
    order. Needs torch only."""
    from torch._inductor import aoti_load_package

    path = Path(path)
    return aoti_load_package(str(path / AOTI_FILE if path.is_dir() else path))


def package_io(path: str | Path) -> dict[str, list[str]]:
    """{"inputs": [...], "outputs": [...]}: the AOTInductor package's flat names (the ONNX graph's)."""
    path = Path(path)
    return json.loads((path / AOTI_IO if path.is_dir() else path.with_name(AOTI_IO)).read_text())


def empty_cache(config, batch_size: int = 1, dtype: torch.dtype = torch.float32):
    """The first step's `past_key_values` for `model.pt2`, exported from a decoder with a `DynamicCache`: one
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


class FlatForward(torch.nn.Module):
    """`module` on flat tensors (`arguments.input_names` order), returning its flat outputs in order."""

    def __init__(self, module: torch.nn.Module, arguments):
        super().__init__()
        self.module, self.arguments = module, arguments

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        kwargs = rebuild_kwargs(dict(zip(self.arguments.input_names, tensors)), self.arguments)
        return tuple(flat_outputs(self.module(**kwargs)).values())


def retrace(program: torch.export.ExportedProgram, arguments, flat: bool = False) -> torch.export.ExportedProgram:
    """The program's graph traced again at the sample (see the module's docstring); `flat`: on flat tensors."""
    module = program.module(check_guards=False)
    with torch.no_grad():
        if not flat:
            return torch.export.export(module, (), kwargs=arguments.kwargs, dynamic_shapes=arguments.dynamic_shapes,
                                       strict=False)
        sample = flat_inputs(arguments.kwargs, list(arguments.kwargs))
        shapes = tuple({axis: torch.export.Dim.DYNAMIC for axis in arguments.axis_names.get(name, {})} or None
                       for name in arguments.input_names)
        return torch.export.export(FlatForward(module, arguments), tuple(sample[n] for n in arguments.input_names),
                                   dynamic_shapes={"tensors": shapes}, strict=False)


class ProgramSession:
    """A reloaded program or package behind the session interface `validate.compare` uses."""

    def __init__(self, run, arguments, flat: bool):
        self._run, self.arguments, self.flat = run, arguments, flat

    def run(self, _names, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        tensors = {n: torch.from_numpy(np.ascontiguousarray(feed[n])) for n in self.arguments.input_names}
        with torch.no_grad():
            if self.flat:
                outputs = self._run(*[tensors[n] for n in self.arguments.input_names])
            else:
                outputs = flat_outputs(self._run(**rebuild_kwargs(tensors, self.arguments))).values()
        return [o.numpy() for o in outputs]

    def get_outputs(self) -> list:
        return []  # no named axes: a token axis is found from input_ids' shape


def write_pt2(program, arguments, directory: Path) -> tuple[str, ProgramSession]:
    program = retrace(program, arguments)
    program.example_inputs = None  # a DynamicCache sample cannot be read back with weights_only loading
    torch.export.save(program, str(directory / PT2_FILE))
    return PT2_FILE, ProgramSession(load_program(directory / PT2_FILE).module(), arguments, flat=False)


def write_aoti(program, arguments, directory: Path, output_names: list[str]) -> tuple[str, ProgramSession]:
    from torch._inductor import aoti_compile_and_package

    flat = retrace(program, arguments, flat=True)
    aoti_compile_and_package(flat, package_path=str(directory / AOTI_FILE))
    (directory / AOTI_IO).write_text(json.dumps({"inputs": arguments.input_names, "outputs": output_names}, indent=2))
    return AOTI_FILE, ProgramSession(load_package(directory / AOTI_FILE), arguments, flat=True)


def write_artifacts(program, part, directory: Path, *, pt2: bool, aoti: bool, atol: float | None,
                    fill=None) -> dict[str, float]:
    """Write the requested files of `part` (a component: its program, module, arguments, calls) into
    `directory`, reload each and compare it with PyTorch on every captured call (within `atol`, default 1e-4).
    Returns file -> max abs difference."""
    # transformers' vmap-built masks leave a `flat_apply` node that the serializer refuses: an empty
    # decomposition table turns the program into plain aten ops (nothing else decomposed)
    program = program.run_decompositions({})
    output_names = list(flat_outputs(part.calls[part.arguments.sample_call].outputs))
    limit = DEFAULT_ATOL if atol is None else atol
    found = {}
    writers = ([lambda: write_pt2(program, part.arguments, directory)] if pt2 else []) + (
        [lambda: write_aoti(program, part.arguments, directory, output_names)] if aoti else [])
    cases = references(part.calls, part.arguments, part.module, fill)
    for write in writers:
        name, session = write()
        rows = compare(session, cases, part.arguments, output_names)
        logger.info("    %s vs PyTorch on %d calls:\n%s", name, len(part.calls), table(rows))
        gate(rows, limit, graph=name)
        found[name] = max(row.max_abs for row in rows)
    return found


__all__ = ["AOTI_FILE", "AOTI_IO", "PT2_FILE", "FlatForward", "empty_cache", "load_package", "load_program",
           "package_io", "retrace", "write_artifacts"]
