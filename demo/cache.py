"""The trained demo adapters under <data dir>/demo/trained/<recipe key>/, trained once and then reused.

The key hashes the recipe (which names the trainer's version) and the base model's hash, so a change to
either trains a new set and an unchanged one is never trained twice. Training holds the set's lock, so a
second run waits for the first one's set instead of training its own, and writes into a fresh folder beside
the target that it renames when done: a crash never leaves a set that looks complete.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

from demo.recipe import DemoRecipe
from lorafleet.file_lock import built_once

log = logging.getLogger(__name__)

MANIFEST_NAME = "demo.json"

Trainer = Callable[[Path, Path, DemoRecipe, str], dict[str, object]]


def set_dir(root: Path, recipe: DemoRecipe, base_hash: str) -> Path:
    """Where the set for this recipe and base lives (complete once it holds the manifest)."""
    return root / recipe.key(base_hash)


def read_manifest(out: Path) -> dict[str, object]:
    """The set's manifest: per adapter its sign-off and training examples, and the training time."""
    manifest: dict[str, object] = json.loads((out / MANIFEST_NAME).read_text())
    return manifest


def ensure_trained(root: Path, model_dir: Path, recipe: DemoRecipe, base_hash: str, train: Trainer) -> Path:
    """The set's folder; when absent, `train(model_dir, folder, recipe, base_hash)` fills a new one."""
    out = set_dir(root, recipe, base_hash)

    def build(partial: Path) -> None:
        start = time.perf_counter()
        manifest = train(model_dir, partial, recipe, base_hash)
        manifest["wall_s"] = round(time.perf_counter() - start, 1)
        (partial / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
        log.info("trained the demo adapters in %s s into %s", manifest["wall_s"], out)

    root.mkdir(parents=True, exist_ok=True)
    return built_once(out, MANIFEST_NAME, build)
