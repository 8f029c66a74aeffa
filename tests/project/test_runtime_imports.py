"""Runtime packages import only what a runtime install has: no dev-only package, at any depth.

A runtime package is one pyproject.toml ships or lorafleet/cli.py mounts. Imports are read with ast,
both at module level and inside functions, so a lazily imported dev tool is caught too. A package may
also import its own extra (`bench` -> the `bench` extra), which the image leaves out.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator, Mapping
from functools import cache
from importlib.metadata import packages_distributions

import pytest
from packaging.utils import NormalizedName, canonicalize_name

from tests.project.project_files import (
    MODEL_LOCK,
    ROOT,
    RUNTIME_LOCK,
    cli_mounted_packages,
    extras,
    packages_find_include,
    read_lock,
    runtime_requirements,
)

RUNTIME_PACKAGES = sorted(set(packages_find_include()) | set(cli_mounted_packages()))


def _type_checking_only(node: ast.AST) -> bool:
    """`if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`): its body never runs."""
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_nodes(node: ast.AST) -> Iterator[ast.AST]:
    """Every node under node, leaving out the bodies of `if TYPE_CHECKING:` blocks."""
    yield node
    for child in ast.iter_child_nodes(node):
        if _type_checking_only(child):
            assert isinstance(child, ast.If)
            for stmt in child.orelse:
                yield from _runtime_nodes(stmt)
        else:
            yield from _runtime_nodes(child)


def imported_roots(source: str) -> set[str]:
    """Top-level names of every absolute import that runs in source: also those inside functions and
    importlib.import_module("...") calls with a literal name; not those under `if TYPE_CHECKING:`."""
    roots: set[str] = set()
    for node in _runtime_nodes(ast.parse(source)):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                roots.add(node.args[0].value.split(".")[0])
    return roots


def third_party_imports(package: str) -> dict[str, list[str]]:
    """import name -> the files of `package` that import it (stdlib and the project's own packages left out)."""
    found: dict[str, list[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        for root in imported_roots(path.read_text()):
            if root not in sys.stdlib_module_names and root not in RUNTIME_PACKAGES:
                found.setdefault(root, []).append(str(path.relative_to(ROOT)))
    return found


@cache
def _installed() -> Mapping[str, list[str]]:
    return packages_distributions()


def distributions_of(import_name: str) -> set[NormalizedName]:
    """The installed distributions that provide a top-level import name (pyyaml provides yaml)."""
    return {canonicalize_name(d) for d in _installed().get(import_name, [])}


def import_names(distribution: NormalizedName) -> set[str]:
    """The top-level import names an installed distribution provides, or its own name if it is not installed."""
    names = {name for name, dists in _installed().items() if distribution in map(canonicalize_name, dists)}
    return names or {distribution.replace("-", "_")}


def own_extra(package: str) -> set[NormalizedName]:
    return {canonicalize_name(r.name) for r in extras().get(package, [])}


def dev_only_imports() -> dict[str, NormalizedName]:
    """import name -> the dev extra's distribution behind it, for every dev requirement not also a runtime one."""
    runtime = {canonicalize_name(r.name) for r in runtime_requirements()}
    dev = {canonicalize_name(r.name) for r in extras()["dev"]} - runtime
    return {name: dist for dist in dev for name in import_names(dist)}


def test_the_runtime_packages_cover_everything_the_cli_mounts():
    assert {"gateway", "replica", "placement_worker", "stats_stream", "lorafleet", "schemas"} <= set(
        RUNTIME_PACKAGES
    )
    assert set(cli_mounted_packages()) <= set(packages_find_include())


def test_dev_only_names_include_the_usual_tools():
    names = dev_only_imports()
    assert {"pytest", "hypothesis", "peft", "testcontainers", "openai", "ruff", "mypy"} <= set(names)
    assert names["kubernetes_validate"] == "kubernetes-validate"
    assert "yaml" not in names  # a runtime dependency too: `lorafleet profile show` reads the cluster files


def test_the_reader_sees_imports_in_functions_and_by_name_but_not_type_checking_ones():
    source = """
import os
from typing import TYPE_CHECKING
import typing

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
else:
    import torch
if typing.TYPE_CHECKING:
    import types_tqdm


def f():
    from peft import LoraConfig
    import yaml.loader
    importlib.import_module("openai")
    if TYPE_CHECKING:
        import pytest
"""
    assert imported_roots(source) == {"os", "typing", "torch", "peft", "yaml", "openai"}


@pytest.mark.parametrize("package", RUNTIME_PACKAGES)
def test_runtime_package_imports_no_dev_only_package(package):
    dev_only = dev_only_imports()
    allowed = own_extra(package)
    bad = {
        f"{name} ({dev_only[name]})": files
        for name, files in third_party_imports(package).items()
        if name in dev_only and dev_only[name] not in allowed
    }
    assert bad == {}


@pytest.mark.parametrize("package", RUNTIME_PACKAGES)
def test_runtime_package_imports_only_what_the_runtime_lock_installs(package):
    installed = set(read_lock(RUNTIME_LOCK)) | set(read_lock(MODEL_LOCK)) | own_extra(package)
    missing = {
        name: files
        for name, files in third_party_imports(package).items()
        if not distributions_of(name) & installed
    }
    assert missing == {}, "declare it in pyproject.toml's dependencies and run scripts/lock.sh"


def test_every_runtime_package_is_a_directory_here():
    assert [p for p in RUNTIME_PACKAGES if not (ROOT / p / "__init__.py").is_file()] == []
