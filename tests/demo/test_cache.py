"""The demo set's cache: trained once per recipe, base and trainer code; a failed run leaves nothing behind."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest

from demo.cache import MANIFEST_NAME, ensure_trained, read_manifest
from demo.recipe import DemoRecipe

ADAPTER_IDS = [p.adapter_id for p in DemoRecipe().personas]


class CountingTrainer:
    """Writes one marker file per adapter and counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, model_dir: Path, out: Path, recipe: DemoRecipe, base_hash: str) -> dict[str, object]:
        self.calls += 1
        for persona in recipe.personas:
            (out / persona.adapter_id).mkdir()
        return {"base_model_hash": base_hash, "adapters": [p.adapter_id for p in recipe.personas]}


def _fail(model_dir: Path, out: Path, recipe: DemoRecipe, base_hash: str) -> dict[str, object]:
    (out / "half-written").write_text("x")
    raise RuntimeError("training failed")


def test_a_second_prepare_reuses_the_set_without_training(tmp_path: Path) -> None:
    train = CountingTrainer()
    first = ensure_trained(tmp_path, tmp_path / "base", DemoRecipe(), "sha256:b", train)
    again = ensure_trained(tmp_path, tmp_path / "base", DemoRecipe(), "sha256:b", train)
    assert first == again and train.calls == 1
    assert read_manifest(first)["base_model_hash"] == "sha256:b" and "wall_s" in read_manifest(first)
    assert sorted(p.name for p in first.iterdir()) == sorted([MANIFEST_NAME, *ADAPTER_IDS])
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == [first.name]  # no partial folder is left


def test_another_recipe_or_base_trains_its_own_set(tmp_path: Path) -> None:
    train = CountingTrainer()
    sets = {
        ensure_trained(tmp_path, tmp_path, DemoRecipe(), "sha256:b", train),
        ensure_trained(tmp_path, tmp_path, replace(DemoRecipe(), lr=1e-4), "sha256:b", train),
        ensure_trained(tmp_path, tmp_path, DemoRecipe(), "sha256:other", train),
    }
    assert len(sets) == 3 and train.calls == 3


def test_a_failed_training_leaves_no_set_and_the_next_run_trains(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError):
        ensure_trained(tmp_path, tmp_path, DemoRecipe(), "sha256:b", _fail)
    assert [p for p in tmp_path.iterdir() if p.is_dir()] == []
    train = CountingTrainer()
    ensure_trained(tmp_path, tmp_path, DemoRecipe(), "sha256:b", train)
    assert train.calls == 1


class SlowTrainer(CountingTrainer):
    """A CountingTrainer that takes long enough for a second run to arrive while it trains."""

    def __init__(self) -> None:
        super().__init__()
        self.started = threading.Event()

    def __call__(self, model_dir: Path, out: Path, recipe: DemoRecipe, base_hash: str) -> dict[str, object]:
        self.started.set()
        time.sleep(0.5)
        return super().__call__(model_dir, out, recipe, base_hash)


def test_a_run_that_arrives_during_training_waits_for_that_set(tmp_path: Path) -> None:
    train = SlowTrainer()
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(ensure_trained, tmp_path, tmp_path, DemoRecipe(), "sha256:b", train)
        assert train.started.wait(10)
        second = pool.submit(ensure_trained, tmp_path, tmp_path, DemoRecipe(), "sha256:b", train)
        assert first.result(10) == second.result(10)
    assert train.calls == 1


def test_a_killed_runs_partial_folder_is_removed_by_the_next_training(tmp_path: Path) -> None:
    out = ensure_trained(tmp_path, tmp_path, DemoRecipe(), "sha256:b", CountingTrainer()).name
    left = tmp_path / f".{DemoRecipe().key('sha256:other')}-killed"
    left.mkdir()
    ensure_trained(tmp_path, tmp_path, DemoRecipe(), "sha256:other", CountingTrainer())
    assert not left.exists() and (tmp_path / out).is_dir()
