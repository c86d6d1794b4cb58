"""Branches on an image's size that the graph cannot keep. torch.export records a model's arithmetic on a
dynamic size (`if width % 4: pad`, `if (height // 16) % 2: ...`) as a guard and exports the branch the sample
took; it raises only when a size is fixed outright. The ONNX graph has no guards: at a size on the other side
it computes the wrong branch. A guard is also how torch records that two shapes must agree (GLPN's upsampled
map and its skip connection); at a size where that fails PyTorch fails too, so a guard counts as a branch only
where the model runs. The capture varied the image size by its own choice (a processor gives one size), so an
image whose size decides a branch is exported at the capture's first size (the config's image_size, else 64)."""

from __future__ import annotations

from typing import Callable

import torch

# torch's sympy functions whose value jumps with the size: a guard made of them is a branch, not a bound
_STEPS = {"Mod", "PythonMod", "FloorDiv", "CleanDiv", "Min", "Max"}
PROBES = range(1, 65)  # sizes above the sample's, where such a branch turns
AXES = {2: "height", 3: "width"}  # of an NCHW image


def image_axes(arguments) -> dict[str, tuple[int, ...]]:
    """The dynamic height and width of each 4-D `pixel_values*` input: sizes the capture chose to vary."""
    found = {}
    for name, axes in arguments.axis_names.items():
        rank = len(arguments.shapes[name][0]) if arguments.shapes.get(name) else 0
        spatial = tuple(a for a in axes if a in (rank - 2, rank - 1))
        if name.startswith("pixel_values") and rank == 4 and spatial:
            found[name] = spatial
    return found


def _steps(expr) -> bool:
    import sympy

    return any(type(e).__name__ in _STEPS for e in sympy.preorder_traversal(expr))


def branches(program: torch.export.ExportedProgram, axes: dict[str, tuple[int, ...]],
             runs: Callable[[str, int, int], bool]) -> list[str]:
    """For each axis of `axes` (input name -> axes) a guard of `program` decides: "GUARD holds at AXIS SIZE, not
    at SIZE+k" (the guard's symbols named after the axes), where `runs(input, axis, SIZE+k)`: the model runs at
    that size."""
    import sympy

    symbols, hints = {}, {}  # sympy symbol -> (input, axis); -> its size in the sample
    env = None
    for node in program.graph.nodes:
        value = node.meta.get("val") if node.op == "placeholder" else None
        if not isinstance(value, torch.Tensor):
            continue
        for axis, size in enumerate(value.shape):
            if isinstance(size, torch.SymInt) and isinstance(size.node.expr, sympy.Symbol) and size.node.has_hint():
                hints[size.node.expr] = sympy.Integer(size.node.hint)
                if axis in axes.get(node.name, ()):
                    symbols.setdefault(size.node.expr, (node.name, axis))
                    env = size.node.shape_env
    if env is None:
        return []
    names = {s: sympy.Symbol(AXES.get(axis, f"{name}.shape[{axis}]")) for s, (name, axis) in symbols.items()}
    ran: dict[tuple[sympy.Symbol, int], bool] = {}
    found: dict[sympy.Symbol, str] = {}
    for guard in env.guards:
        expr = guard.expr
        probed = [s for s in expr.free_symbols if s in symbols and s not in found]
        if not probed or not _steps(expr):
            continue
        for s in probed:
            turn = next((k for k in PROBES if expr.xreplace({**hints, s: hints[s] + k}) is sympy.false), None)
            if turn is None:
                continue
            if (s, turn) not in ran:
                ran[s, turn] = runs(*symbols[s], int(hints[s]) + turn)
            if ran[s, turn]:
                found[s] = f"{expr.xreplace(names)} holds at {names[s]} {hints[s]}, not at {hints[s] + turn}"
    return list(found.values())


__all__ = ["branches", "image_axes"]
