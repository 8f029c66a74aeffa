"""No module cycle inside a package: read with `ast`, never by importing, as tests/test_import_graph.py reads
the package graph. Every import counts (module level, inside functions, under `if TYPE_CHECKING:`), since a
lazy import that closes a loop is a loop all the same; `from a import b` names the module a.b when a/b.py
exists, else a itself."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.test_import_graph import CHECKED, REPO, module_name, top_level_packages


def modules(repo: Path = REPO) -> dict[str, Path]:
    """Dotted name -> file of every module of our checked packages (a package's __init__ names the package)."""
    out = {}
    for package in sorted(top_level_packages(repo) & CHECKED):
        for path in sorted((repo / package).rglob("*.py")):
            out[".".join(module_name(path, repo))] = path
    return out


def _targets(node: ast.AST, package: list[str], known: dict[str, Path]) -> Iterator[str]:
    """The modules of ours an import statement loads: `from a import b, c` means a.b and a.c where those
    are modules, else a."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names if alias.name in known)
    elif isinstance(node, ast.ImportFrom):
        base = package[: len(package) - (node.level - 1)] if node.level else []
        module = ".".join([*base, *([node.module] if node.module else [])])
        submodules = [f"{module}.{a.name}" for a in node.names if f"{module}.{a.name}" in known]
        yield from submodules or ([module] if module in known else [])


def module_graph(repo: Path = REPO) -> dict[str, set[str]]:
    """module -> the modules of its own top-level package that it imports."""
    known = modules(repo)
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        found = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for target in _targets(node, package, known):
                if target.split(".")[0] == name.split(".")[0] and target != name:
                    found.add(target)
        graph[name] = found
    return graph


def module_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(out)


def test_no_package_has_a_module_cycle() -> None:
    graph = module_graph()
    found = module_cycles(graph)
    lines = [" <-> ".join(group) for group in found]
    print("\n".join(lines) or "no module cycle")
    assert not found, "modules that import each other around a loop:\n" + "\n".join(lines)


def test_the_scan_finds_a_lazy_module_cycle_and_reads_from_imports(tmp_path: Path) -> None:
    (tmp_path / "ops" / "auto").mkdir(parents=True)
    for init in ("ops/__init__.py", "ops/auto/__init__.py"):
        (tmp_path / init).write_text("")
    (tmp_path / "ops" / "auto" / "local.py").write_text("from ops.auto.view import rows\n")
    (tmp_path / "ops" / "auto" / "view.py").write_text("def rows():\n    from . import merged\n")
    (tmp_path / "ops" / "auto" / "merged.py").write_text("from ops.auto import local\n")
    (tmp_path / "ops" / "auto" / "decide.py").write_text("from ops.auto.records import Record\n")
    (tmp_path / "ops" / "auto" / "records.py").write_text("import os\n")
    graph = module_graph(tmp_path)
    assert graph["ops.auto.view"] == {"ops.auto.merged"}
    assert graph["ops.auto.merged"] == {"ops.auto.local"}
    assert graph["ops.auto.decide"] == {"ops.auto.records"}
    assert module_cycles(graph) == [["ops.auto.local", "ops.auto.merged", "ops.auto.view"]]
