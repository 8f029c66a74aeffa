"""The placement worker's merged-replica decisions on the real PostgreSQL: the streaks survive a restarted
worker, each decision commits with its merged.target outbox row, and an alias move hands the merge over."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from harness.seed import ReadyAdapter, insert_ready_adapters
from placement_worker.config import PlacementSettings
from placement_worker.consumer import PlacementWorker
from schemas.events import AdapterStats, AliasChanged

pytestmark = pytest.mark.integration

HASH = "sha256:" + "a" * 64  # the adapters' base model hash: nothing here compares it

WS = 10.0


async def _targets(pool: asyncpg.Pool) -> list[tuple[str, int, str]]:
    rows = await pool.fetch("SELECT payload FROM outbox WHERE aggregate_type = 'merged.targets' ORDER BY seq")
    payloads = [json.loads(r["payload"]) for r in rows]
    return [(p["adapter_id"], p["desired_replicas"], p["reason"]) for p in payloads]


def _window(adapter_id: str, start: datetime, tps: float) -> AdapterStats:
    return AdapterStats(
        adapter_id=adapter_id,
        window_start=start,
        window_seconds=WS,
        requests=10,
        tokens_per_s=tps,
        gpu_hit_rate=1.0,
    )


async def test_promotion_demotion_and_an_alias_move_go_through_the_outbox(pool: asyncpg.Pool) -> None:
    run = uuid.uuid4().hex[:6]
    v1, v2 = f"acme-{run}-v1", f"acme-{run}-v2"
    await pool.execute("INSERT INTO tenants (tenant_id) VALUES ('acme')")
    await insert_ready_adapters(pool, [ReadyAdapter(v1, "acme", HASH), ReadyAdapter(v2, "acme", HASH, 2)])
    settings = PlacementSettings(merge_windows=3, demote_windows=2, replica_id_prefix=f"t{run}-")
    start = datetime.now(UTC) - timedelta(seconds=5 * WS)
    worker = PlacementWorker(pool, settings)
    await worker.handle(_window(v1, start, 700))
    await worker.handle(_window(v1, start + timedelta(seconds=WS), 700))
    await worker.handle(_window(v1, start + timedelta(seconds=WS), 700))  # a duplicate counts once
    assert await _targets(pool) == []
    worker = PlacementWorker(pool, settings)  # a restart keeps the streak
    await worker.handle(_window(v1, start + timedelta(seconds=2 * WS), 700))
    assert await _targets(pool) == [(v1, 1, "promote")]
    assert await pool.fetchval("SELECT desired_replicas FROM merged_targets WHERE adapter_id = $1", v1) == 1

    await pool.execute(
        "INSERT INTO aliases (alias, tenant_id, adapter_id, revision) VALUES ('acme/x', 'acme', $1, 1)", v1
    )
    await pool.execute("UPDATE aliases SET adapter_id = $1, revision = 2 WHERE alias = 'acme/x'", v2)
    moved = AliasChanged(alias="acme/x", tenant_id="acme", adapter_id=v2, previous_adapter_id=v1, revision=2)
    await worker.tick()  # sees v1 retired by the alias row before the alias event arrives
    assert await _targets(pool) == [(v1, 1, "promote"), (v1, 0, "retired")]
    await worker.handle(moved)
    await worker.handle(moved)  # exactly once
    assert await _targets(pool) == [(v1, 1, "promote"), (v1, 0, "retired"), (v2, 1, "alias_moved")]

    await worker.handle(_window(v1, start + timedelta(seconds=3 * WS), 900))  # retired: never again
    await worker.handle(_window(v2, start + timedelta(seconds=3 * WS), 100))
    await worker.handle(_window(v2, start + timedelta(seconds=4 * WS), 100))
    assert (await _targets(pool))[3:] == [(v2, 0, "demote")]
