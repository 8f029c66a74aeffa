"""SmolLM2 canaries for the end-to-end tests, trained by `lorafleet canary train` once per settings and kept
under the data dir for later runs."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

from canary.manifest import MANIFEST_NAME
from canary.train import TrainConfig
from lorafleet.file_lock import built_once
from ops.stack.paths import REPO_ROOT as REPO

# Cold training runs in its own process under this budget, apart from the probe's own timeout: on a 2-core
# box shared with another CPU-heavy job, torch's threads contend and training slows several-fold.
TRAIN_BUDGET_S = 1800
# One set of SmolLM2 canaries for every end-to-end test (the probe and the gateway churn run): training is
# the dearest step of a fresh clone's suite, so it runs once. Two tenants, each with a v1 and a v2 canary.
E2E_CANARIES = TrainConfig(count=4, seed=11, ranks=(8, 16), rows_per_adapter=2)
_TRAIN_FLAGS = {
    "count": "--count",
    "seed": "--seed",
    "ranks": "--ranks",
    "max_steps": "--max-steps",
    "adapters_per_batch": "--adapters-per-batch",
    "rows_per_adapter": "--rows-per-adapter",
}


def _train_argv(cfg: TrainConfig, out: Path) -> list[str]:
    """`lorafleet canary train` for exactly cfg (every field it sets is one the command takes)."""
    values = {field: getattr(cfg, field) for field in _TRAIN_FLAGS}
    assert TrainConfig(**values) == cfg, "the test's settings must all be `canary train` options"
    argv = [sys.executable, "-m", "lorafleet.cli", "canary", "train", "--out", str(out), "--no-progress"]
    for field, flag in _TRAIN_FLAGS.items():
        value = values[field]
        argv += [flag, ",".join(map(str, value)) if isinstance(value, tuple) else str(value)]
    return argv


def _trainer_digest() -> str:
    """sha256 over the canary package's sources and the LoRA wrapper it trains with: a changed trainer never
    reuses an older one's canaries."""
    h = hashlib.sha256()
    for path in [*sorted((REPO / "canary").glob("*.py")), REPO / "demo" / "lora.py"]:
        h.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def trained_canaries(cfg: TrainConfig) -> Path:
    """<data dir>/canaries/<hash of cfg, base and trainer code>: trained once, reused by later runs.

    The data dir is the platform's (LORAFLEET_DATA_DIR, default .data). Training holds the set's lock, so
    a second run waits for the first one's canaries instead of training its own, and writes into a fresh
    folder beside the target that it renames when done: a crash never leaves a manifest that looks complete.
    """
    from lorafleet.config import get_settings
    from lorafleet.model.base_hash import base_model_hash
    from lorafleet.model.prepare import ensure_default_model

    model_dir = ensure_default_model()
    key = json.dumps(
        {"base": base_model_hash(model_dir), "trainer": _trainer_digest(), **asdict(cfg)}, sort_keys=True
    )
    root = get_settings().data_path / "canaries"
    out = root / hashlib.sha256(key.encode()).hexdigest()[:16]
    root.mkdir(parents=True, exist_ok=True)

    def build(partial: Path) -> None:
        done = subprocess.run(
            _train_argv(cfg, partial), cwd=REPO, capture_output=True, text=True, timeout=TRAIN_BUDGET_S
        )
        assert done.returncode == 0, done.stderr[-3000:]

    return built_once(out, MANIFEST_NAME, build)
