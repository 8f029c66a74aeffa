"""The short fault soak: each fault once (relay, registry validator, placement worker, a replica, the Kafka
broker, PostgreSQL) under canary chats, alias moves and registrations, and every invariant of
bench/soak/invariants.py holds at the end. `lorafleet bench soak --minutes N` is the long run."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from bench.soak.driver import SoakConfig, run_soak
from bench.soak.schedule import FAULTS
from harness.canary_training import E2E_CANARIES, trained_canaries
from harness.stacks import outage as ostack
from tests.integration.services import ServiceAddresses

pytestmark = [
    pytest.mark.integration,
    pytest.mark.trains("e2e-canaries"),
    pytest.mark.skipif(ostack.missing_local_infra() is not None, reason=str(ostack.missing_local_infra())),
]

SEED = 20261202
# every fault once, close together: the run is as long as the faults and the recoveries after them
CONFIG = SoakConfig(seed=SEED, duration_s=1.0, gap_s=(2.0, 4.0))


@pytest.fixture(scope="module")
async def canaries() -> Path:
    return await asyncio.to_thread(trained_canaries, E2E_CANARIES)


@pytest.mark.timeout(900, func_only=True)
async def test_every_invariant_holds_through_each_fault_once(
    services: ServiceAddresses, canaries: Path
) -> None:
    summary = await run_soak(CONFIG, services.settings(), canaries)
    print(json.dumps(summary))  # the seed and schedule replay a failure: lorafleet bench soak --seed
    assert sorted(f["fault"] for f in summary["faults"]) == sorted(FAULTS), summary["faults"]
    failed = {name: v for name, v in summary["invariants"].items() if not v["pass"]}
    assert not failed, json.dumps({"seed": SEED, "failed": failed, "counts": summary["counts"]}, indent=1)
    counts = summary["counts"]
    assert counts["alias_moves_acked"] > 0 and counts["usage_events"] > 0, counts
    assert {"ready", "rejected"} <= set(counts["registrations"]), counts
    # The data plane through the control plane's outages: chats are served from the gateway's key and alias
    # caches while PostgreSQL is down, and to the replicas it knew while Kafka is down (lorafleet/feed.py).
    during = {f["fault"]: f["chats_during"] for f in summary["faults"]}
    assert during["postgres"].get("200", 0) > 0, during
    assert during["kafka"].get("200", 0) > 0, during
    assert not [k for k in during["kafka"] if "no_replica_available" in k], during
