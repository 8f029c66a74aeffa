"""Isolation under churn, at any request count: `python -m bench.isolation --requests 10000` prints JSON.

Trains tiny canaries (or reuses a folder `lorafleet canary train --tiny` wrote), then serves the requests
through a replica's own app with few GPU slots and little host RAM (canary.churn). Exits 1 unless every
output carried only its own marker and every pin was released.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

from canary.churn import ChurnConfig, churn_ok, churn_settings, run_churn
from canary.manifest import CanaryManifest
from canary.tiny_base import write_tiny_base
from canary.train import TrainConfig, train_canaries
from replica.runtime import build_replica


def _canaries(root: Path, count: int, seed: int) -> tuple[Path, Path, CanaryManifest, float]:
    """root/base and root/canaries (trained now unless a manifest is there); the training seconds."""
    base, out = root / "base", root / "canaries"
    if (out / "manifest.json").is_file():
        return base, out, CanaryManifest.read(out), 0.0
    start = time.perf_counter()
    write_tiny_base(base, seed)
    result = train_canaries(base, out, TrainConfig(count=count, seed=seed), progress=False)
    return base, out, result.manifest, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=10_000)
    p.add_argument("--canaries", type=int, default=64, help="tiny canaries to train (ranks 8/16/32)")
    p.add_argument("--dir", type=Path, default=None, help="keep (or reuse) the tiny base and canaries here")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--slots-per-bucket", type=int, default=2)
    p.add_argument("--ram-adapters", type=int, default=6)
    p.add_argument("--max-new-tokens", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    cfg = ChurnConfig(
        requests=args.requests,
        concurrency=args.concurrency,
        slots_per_bucket=args.slots_per_bucket,
        ram_adapters=args.ram_adapters,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
    )
    with tempfile.TemporaryDirectory(prefix="lorafleet-isolation-") as tmp:
        root = args.dir or Path(tmp)
        base, out, manifest, train_s = _canaries(root, args.canaries, args.seed)
        replica = build_replica(churn_settings(base, out, manifest, cfg, Path(tmp) / "cache"))
        summary = asyncio.run(run_churn(replica, cfg, manifest.markers()))
    summary["train_s"] = round(train_s, 2)
    summary["pass"] = churn_ok(summary)
    print(json.dumps(summary))
    return 0 if summary["pass"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
