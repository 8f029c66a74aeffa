"""Read the repository's packaging files: pyproject.toml's requirements, the lock files, the CLI's mounts."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import NormalizedName, canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
LOCKS = ROOT / "requirements"
RUNTIME_LOCK, DEV_LOCK, MODEL_LOCK = (LOCKS / f"{n}.lock" for n in ("runtime", "dev", "model"))

# The environment the locks are compiled for (scripts/lock.sh): Linux x86_64, CPython 3.11.
TARGET_ENV = {
    "python_version": "3.11",
    "python_full_version": "3.11.0",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "os_name": "posix",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "extra": "",
}

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+?)\s*(?:\\|$)")
_HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")


@dataclass(frozen=True)
class Pin:
    version: str
    hashes: tuple[str, ...]


def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def for_target(requirements: list[str]) -> list[Requirement]:
    """The requirements whose markers hold on the lock's target."""
    reqs = [Requirement(r) for r in requirements]
    return [r for r in reqs if r.marker is None or r.marker.evaluate(TARGET_ENV)]


def runtime_requirements() -> list[Requirement]:
    return for_target(pyproject()["project"]["dependencies"])


def extras() -> dict[str, list[Requirement]]:
    """extra name -> its requirements on the target."""
    return {name: for_target(reqs) for name, reqs in pyproject()["project"]["optional-dependencies"].items()}


def read_lock(path: Path) -> dict[NormalizedName, Pin]:
    """name -> its pinned version and sha256 hashes, from a `uv pip compile --generate-hashes` file."""
    pins: dict[NormalizedName, Pin] = {}
    current: tuple[NormalizedName, str, list[str]] | None = None
    for line in path.read_text().splitlines():
        if m := _PIN.match(line):
            if current:
                pins[current[0]] = Pin(current[1], tuple(current[2]))
            current = (canonicalize_name(m[1]), m[2], [])
        elif current and (h := _HASH.search(line)):
            current[2].append(h[1])
    if current:
        pins[current[0]] = Pin(current[1], tuple(current[2]))
    return pins


def packages_find_include() -> list[str]:
    """Top-level packages pyproject.toml ships (`lorafleet*` -> `lorafleet`)."""
    include = pyproject()["tool"]["setuptools"]["packages"]["find"]["include"]
    return sorted({pattern.rstrip("*").rstrip(".") for pattern in include})


def cli_mounted_packages() -> list[str]:
    """Top-level packages of every module lorafleet/cli.py mounts."""
    from lorafleet.cli import COMMANDS, SUBCOMMANDS

    modules = [m for m, *_ in SUBCOMMANDS.values()] + [m for m, _ in COMMANDS.values()]
    return sorted({m.split(".")[0] for m in modules})


def cli_commands() -> set[str]:
    """Every command name the `lorafleet` CLI answers to."""
    from lorafleet.cli import COMMANDS, SUBCOMMANDS

    return set(COMMANDS) | set(SUBCOMMANDS)
