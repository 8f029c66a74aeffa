"""The stats stream's sink and the placement worker on one real PostgreSQL, in production order: the stream
stores a window's adapter_stats row, then publishes adapter.stats; the worker must still replan on it."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import cast

import asyncpg
import pytest

from harness.seed import ReadyAdapter, insert_ready_adapters
from placement_worker import store
from placement_worker.config import PlacementSettings
from placement_worker.consumer import PlacementWorker
from schemas.events import AdapterStats
from stats_stream.closing import WindowReport
from stats_stream.sinks import write_adapter_stats

pytestmark = pytest.mark.integration

HASH = "sha256:" + "a" * 64  # the adapters' base model hash: nothing here compares it


async def _owners(pool: asyncpg.Pool, adapter_id: str) -> set[str]:
    rows = await pool.fetch(
        "SELECT replica_id FROM placements WHERE adapter_id = $1 AND role = 'owner'", adapter_id
    )
    return {r["replica_id"] for r in rows}


async def test_a_window_the_stream_stored_first_still_raises_the_owner_count(pool: asyncpg.Pool) -> None:
    run = uuid.uuid4().hex[:6]
    prefix, adapter = f"j{run}-r", f"acme-{run}-hot"
    await pool.execute("INSERT INTO tenants (tenant_id) VALUES ('acme')")
    await insert_ready_adapters(pool, [ReadyAdapter(adapter, "acme", HASH)])
    now = datetime.now(UTC)
    for i in range(6):
        await store.upsert_heartbeat(pool, f"{prefix}{i}", f"http://127.0.0.1:{i}", "ready", now, now, 8)
    settings = PlacementSettings(
        replica_id_prefix=prefix, tick_s=0.01, membership_ttl_s=600, demand_ttl_s=TTL_S, decay_check_s=0.05
    )
    worker = PlacementWorker(pool, settings)
    worker.feed.delivered()  # no consumer here: the heartbeats above are the whole feed
    await worker.tick()  # the first look plans the fleet: the default two owners
    assert len(await _owners(pool, adapter)) == settings.default_owners

    # 2,000 tok/s needs ceil(2000 / 640) = 4 owners (the brief's 640 tok/s per replica).
    window = AdapterStats(
        adapter_id=adapter,
        window_start=now.replace(microsecond=0),
        window_seconds=60,
        requests=480,
        tokens_per_s=2000.0,
        gpu_hit_rate=1.0,
    )
    await write_adapter_stats(pool, cast(WindowReport, SimpleNamespace(adapter_stats=[window])))
    await worker.on_stats(window)
    await asyncio.sleep(0.02)  # past tick_s: the dirty set is replanned on the next tick
    await worker.tick()
    assert len(await _owners(pool, adapter)) == 4

    # A redelivered event is not news: it changes nothing and marks nothing dirty.
    assert not await store.record_stats(pool, adapter, window.window_start, 480, 2000.0, 1.0)
    # The stream closing the window again with new totals is news.
    assert await store.record_stats(pool, adapter, window.window_start, 600, 2500.0, 1.0)

    # Traffic stops: no more windows. Once the last one is older than demand_ttl_s, the worker's periodic
    # check replans the adapter back to the default owner count, with no event to trigger it.
    await asyncio.sleep(TTL_S + 0.2)
    for _ in range(3):
        await worker.tick()
        await asyncio.sleep(0.06)
    assert len(await _owners(pool, adapter)) == settings.default_owners


TTL_S = 2.0
