"""No import cycle in the package: every `import` / `from ... import` of a module (at its top or inside a
function) that names another module of optimum_dynamo or legacy_bridge is an edge; the graph has no cycle."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _modules() -> dict[str, tuple[Path, bool]]:
    found = {}
    for top in ("optimum_dynamo", "legacy_bridge"):
        for path in (ROOT / top).rglob("*.py"):
            if "cli_register" in path.parts:  # installed into optimum's namespace, not a module of ours
                continue
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            package = parts[-1] == "__init__"
            found[".".join(parts[:-1] if package else parts)] = (path, package)
    return found


def _imports(name: str, path: Path, package: bool, modules) -> set[str]:
    edges = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            edges |= {a.name for a in node.names if a.name in modules}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if package else name.split(".")[:-1]
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                edges |= {sub} if sub in modules else ({target} if target in modules else set())
    return edges


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_in_the_package():
    modules = _modules()
    graph = {name: _imports(name, path, package, modules) for name, (path, package) in modules.items()}
    assert "optimum_dynamo.cli.driver" in graph["optimum_dynamo.cli.onnx"]  # edges are read
    assert cycles(graph) == []
