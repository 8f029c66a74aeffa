"""Which top-level package may import which: read from the source with `ast`, never by importing it.

Every `import x` and `from x import y` counts, at module level and inside functions, classes and
`if TYPE_CHECKING:` blocks, and so does `importlib.import_module("literal")`; relative imports resolve to
their own package. The rules:
- the services (gateway, replica, placement_worker, stats_stream, relay) import only themselves, `schemas`
  and the platform package `lorafleet`;
- `schemas` imports none of our packages; `lorafleet` imports only `schemas`;
- the tools (ops, demo, harness, sim, loadtest, bench, canary, scripts) are never imported by a service,
  `schemas` or `lorafleet`, and never import `tests`;
- the graph of top-level packages has no cycle, and neither has the graph of modules inside a package
  (tests/test_module_cycles.py).

The composition root: `lorafleet/cli.py` names every package's command (services and tools alike) in its
SUBCOMMANDS and COMMANDS tables and imports the one asked for through `importlib.import_module(name)` when
the command runs. That is the one place that is allowed to know every package, so those table entries are
not edges of the graph. The exemption is exactly that: the tables must hold only string literals, every
module they name must exist, and any other import in lorafleet/cli.py obeys the rules like any other file.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SERVICES = frozenset({"gateway", "replica", "placement_worker", "stats_stream", "relay"})
TOOLS = frozenset({"ops", "demo", "harness", "sim", "loadtest", "bench", "canary", "scripts"})
PLATFORM = "lorafleet"
CONTRACTS = "schemas"
TESTS = "tests"
CHECKED = SERVICES | TOOLS | {PLATFORM, CONTRACTS}
COMPOSITION_ROOT = REPO / "lorafleet" / "cli.py"
ROOT_TABLES = ("SUBCOMMANDS", "COMMANDS")


@dataclass(frozen=True)
class Edge:
    """One import of another top-level package of ours, where it is written."""

    source: str  # the importing top-level package
    target: str  # the imported top-level package
    path: Path  # relative to the repository root
    line: int
    text: str

    def where(self) -> str:
        return f"{self.path}:{self.line}: {self.text}"


def top_level_packages(repo: Path = REPO) -> frozenset[str]:
    """Our importable names: every root folder with an __init__.py, and scripts/."""
    names = {p.parent.name for p in repo.glob("*/__init__.py")}
    return frozenset(names | {"scripts"})


def module_name(path: Path, repo: Path = REPO) -> list[str]:
    """The dotted name of a source file as parts (a package's __init__ names the package)."""
    parts = list(path.relative_to(repo).with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def imported_names(tree: ast.AST, path: Path, repo: Path = REPO) -> Iterator[tuple[str, int]]:
    """(absolute module name, line) of every import in a file, relative ones resolved."""
    own = module_name(path, repo)
    package = own if path.name == "__init__.py" else own[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                yield ".".join([*base, *([node.module] if node.module else [])]), node.lineno
            elif node.module:
                yield node.module, node.lineno
        elif isinstance(node, ast.Call) and _is_import_module(node.func):
            arg = node.args[0] if node.args else None
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                yield arg.value, node.lineno


def dynamic_imports_by_name(path: Path) -> list[int]:
    """Lines where a file imports a module whose name is not a literal (the scan cannot see the target)."""
    tree = ast.parse(path.read_text(), str(path))
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and _is_import_module(node.func)
        and not (node.args and isinstance(node.args[0], ast.Constant))
    ]


def _is_import_module(func: ast.expr) -> bool:
    if isinstance(func, ast.Attribute):
        return (
            func.attr == "import_module" and isinstance(func.value, ast.Name) and func.value.id == "importlib"
        )
    return isinstance(func, ast.Name) and func.id in ("import_module", "__import__")


def edges(repo: Path = REPO) -> list[Edge]:
    """Every import from one of our top-level packages to another (self-imports left out)."""
    ours = top_level_packages(repo)
    out = []
    for source in sorted(ours & CHECKED):
        for path in sorted((repo / source).rglob("*.py")):
            lines = path.read_text().splitlines()
            tree = ast.parse("\n".join(lines), str(path))
            for name, line in imported_names(tree, path, repo):
                target = name.split(".")[0]
                if target in ours and target != source:
                    out.append(Edge(source, target, path.relative_to(repo), line, lines[line - 1].strip()))
    return out


def allowed(source: str, target: str) -> bool:
    """The rule for one edge between two different top-level packages."""
    if source == CONTRACTS:
        return False
    if source == PLATFORM:
        return target == CONTRACTS
    if source in SERVICES:
        return target in (CONTRACTS, PLATFORM)
    # a tool may use anything but the tests; nothing but a tool may use a tool (rules above)
    return source in TOOLS and target != TESTS


def forbidden(found: list[Edge]) -> list[Edge]:
    return [e for e in found if not allowed(e.source, e.target)]


def cycles(found: list[Edge]) -> list[list[str]]:
    """Every cycle of the package graph, each as the list of packages around it (smallest name first)."""
    graph: dict[str, set[str]] = {}
    for e in found:
        graph.setdefault(e.source, set()).add(e.target)
    seen: set[tuple[str, ...]] = set()
    out = []

    def walk(start: str, node: str, trail: list[str]) -> None:
        for nxt in sorted(graph.get(node, ())):
            if nxt == start:
                key = tuple(trail)
                if min(trail) == start and key not in seen:
                    seen.add(key)
                    out.append([*trail, start])
            elif nxt not in trail:
                walk(start, nxt, [*trail, nxt])

    for start in sorted(graph):
        walk(start, start, [start])
    return out


def root_table_modules(path: Path = COMPOSITION_ROOT) -> list[tuple[str, int]]:
    """(module, line) of every entry of the composition root's tables; each entry is a literal tuple."""
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in tree.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        if node.target.id in ROOT_TABLES and node.value is not None:
            table = ast.literal_eval(node.value)  # raises unless the table is made of literals
            out += [(entry[0], node.lineno) for entry in table.values()]
    assert set(ROOT_TABLES) <= {
        n.target.id for n in tree.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    }, f"{path} should define {ROOT_TABLES}"
    return out


def _report(title: str, found: list[Edge]) -> str:
    return title + "\n" + "\n".join(f"  {e.source} -> {e.target}  {e.where()}" for e in found)


def test_every_edge_between_top_level_packages_is_allowed() -> None:
    bad = forbidden(edges())
    print(_report("forbidden imports:", bad) if bad else "no forbidden imports")
    assert not bad, _report("forbidden imports:", bad)


def test_no_service_imports_a_tool() -> None:
    found = [e for e in edges() if e.source in SERVICES and e.target in TOOLS]
    assert not found, _report("services importing tools:", found)


def test_no_tool_imports_the_tests() -> None:
    found = [e for e in edges() if e.source in TOOLS and e.target == TESTS]
    assert not found, _report("tools importing tests:", found)


def test_the_package_graph_has_no_cycle() -> None:
    found = edges()
    loops = cycles(found)
    lines = []
    for loop in loops:
        hops = zip(loop, loop[1:], strict=False)
        lines.append(" -> ".join(loop))
        for a, b in hops:
            hop = [e for e in found if (e.source, e.target) == (a, b)]
            lines += [f"  {e.where()}" for e in hop[:3]] + (
                [f"  ({len(hop) - 3} more)"] if len(hop) > 3 else []
            )
    print("\n".join(lines) or "no cycle")
    assert not loops, "cycles among top-level packages:\n" + "\n".join(lines)


def test_the_composition_root_names_only_modules_that_exist() -> None:
    entries = root_table_modules()
    assert {m.split(".")[0] for m, _ in entries} >= {"gateway", "replica", "canary", "sim", "loadtest"}
    missing = [
        f"lorafleet/cli.py:{line}: {module}"
        for module, line in entries
        if not (REPO / Path(*module.split("."))).with_suffix(".py").is_file()
        and not (REPO / Path(*module.split(".")) / "__init__.py").is_file()
    ]
    assert not missing, "the CLI mounts modules that do not exist:\n" + "\n".join(missing)


def test_only_the_composition_root_imports_a_module_named_at_run_time() -> None:
    found = [
        f"{path.relative_to(REPO)}:{line}"
        for pkg in sorted(top_level_packages() & CHECKED)
        for path in sorted((REPO / pkg).rglob("*.py"))
        if path != COMPOSITION_ROOT
        for line in dynamic_imports_by_name(path)
    ]
    assert not found, "imports by a computed name, invisible to this test:\n" + "\n".join(found)
    assert dynamic_imports_by_name(COMPOSITION_ROOT), "the CLI mounts its commands by name"


def test_the_scan_sees_every_kind_of_import(tmp_path: Path) -> None:
    (tmp_path / "gateway" / "routes").mkdir(parents=True)
    for pkg in ("gateway", "gateway/routes", "replica", "schemas", "sim", "tests"):
        (tmp_path / pkg / "__init__.py").parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "scripts").mkdir()
    (tmp_path / "gateway" / "routes" / "chat.py").write_text(
        "import replica.engine\n"
        "from . import deps\n"
        "from ..config import X\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from sim import timing\n"
        "def f():\n"
        "    import importlib\n"
        "    from schemas.api import A\n"
        "    return importlib.import_module('scripts.validate')\n"
    )
    (tmp_path / "schemas" / "ids.py").write_text(
        "class C:\n    def m(self):\n        from gateway import x\n"
    )
    (tmp_path / "sim" / "run.py").write_text("from tests.integration import helpers\n")
    found = edges(tmp_path)
    got = sorted((e.source, e.target, e.line) for e in found)
    assert got == [
        ("gateway", "replica", 1),
        ("gateway", "schemas", 9),
        ("gateway", "scripts", 10),
        ("gateway", "sim", 6),
        ("schemas", "gateway", 3),
        ("sim", "tests", 1),
    ]
    assert sorted((e.source, e.target) for e in forbidden(found)) == [
        ("gateway", "replica"),
        ("gateway", "scripts"),
        ("gateway", "sim"),
        ("schemas", "gateway"),
        ("sim", "tests"),
    ]
    assert cycles(found) == [["gateway", "schemas", "gateway"]]
    assert forbidden(found)[0].where() == "gateway/routes/chat.py:1: import replica.engine"
