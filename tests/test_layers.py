"""The package's import graph: no module imports one that imports it back, and the layers
point one way (cli → profile → ingest/analysis → render; analysis is pure, ingest reads only).
No file name is used in two layers (``ingest/ncu.py`` beside ``profile/ncu.py`` read alike).

Imports are read from the source (``ast``), function-level ones included: a lazy import is
still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "kerneltriage"

# layer -> layers it must never import
FORBIDDEN = {
    "analysis": {"render", "cli", "profile"},
    "ingest": {"analysis", "render", "cli"},
    "render": {"cli", "profile"},
}


def module_names() -> dict[str, Path]:
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The module ``name`` refers to: itself, or its closest enclosing package or module."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    """Module -> the kerneltriage modules it imports."""
    modules = module_names()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                # ``from pkg import sub`` imports the submodule when there is one.
                targets = [f"{base}.{alias.name}" for alias in node.names] or [base]
            for target in targets:
                if target == "kerneltriage" or target.startswith("kerneltriage."):
                    resolved = _resolve(target, modules)
                    if resolved and resolved != name:
                        found.add(resolved)
        graph[name] = found
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
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
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def layer(module: str) -> str | None:
    parts = module.split(".")
    if len(parts) < 2:
        return None
    return parts[1]  # "analysis", "render", … or a top-level module such as "api"


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


def test_the_graph_is_read(graph):
    # The reader sees top-level, function-level and ``from pkg import module`` imports.
    assert "kerneltriage.analysis.judge.verdict" in graph["kerneltriage.analysis.triage"]
    assert "kerneltriage.render.html" in graph["kerneltriage.render"]  # lazy, in render()
    assert "kerneltriage.profile.nsight_compute" in graph["kerneltriage.profile.session"]
    assert "kerneltriage.cli.report_command" in graph["kerneltriage.cli"]
    assert "kerneltriage.api" in graph["kerneltriage.cli.report_command"]


def test_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles(graph):
    assert cycles(graph) == []


def test_layers_point_one_way(graph):
    wrong = [
        f"{source} imports {target}"
        for source, targets in graph.items()
        for target in targets
        if layer(target) in FORBIDDEN.get(layer(source) or "", set())
    ]
    assert wrong == []


def test_file_names_are_unique_across_layers():
    layers: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name != "__init__.py":
            parts = path.relative_to(PACKAGE).parts
            layers.setdefault(path.name, set()).add(parts[0] if len(parts) > 1 else "kerneltriage")
    assert {name: sorted(where) for name, where in layers.items() if len(where) > 1} == {}


#: Files that may run long: Triton kernels and their launchers keep a kernel's story in one file
#: (the Triton tutorials' way), and templates are the packages ``scaffold`` writes.
LONG_FILES_ALLOWED = ("kernels", "scaffold/families/templates", "data")
MAX_LINES = 600


def test_no_file_over_600_lines_outside_kernels_and_templates():
    long = {
        str(path.relative_to(PACKAGE)): n
        for path in PACKAGE.rglob("*.py")
        if not str(path.relative_to(PACKAGE)).startswith(LONG_FILES_ALLOWED)
        and (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def test_no_two_public_classes_share_a_name():
    where: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                where.setdefault(node.name, []).append(str(path.relative_to(PACKAGE)))
    assert {name: files for name, files in where.items() if len(files) > 1} == {}
