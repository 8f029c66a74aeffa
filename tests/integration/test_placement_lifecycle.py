"""The placement worker and a replica's life, on the real Kafka and PostgreSQL: a warming replica is placed
on and marked planned; one that restarts under its id (warming again) gets every load it owns re-sent; a
draining one loses its placements to the others at once."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from datetime import UTC, datetime

import asyncpg
import pytest

from harness.seed import ReadyAdapter, insert_ready_adapters
from lorafleet.kafka import make_producer
from placement_worker.config import PlacementConfig, PlacementSettings
from placement_worker.main import run_worker
from schemas.events import ReplicaStatus
from schemas.rendezvous import owners
from tests.integration.signed_states import SignedReplicas
from tests.integration.waiting import wait_until

pytestmark = pytest.mark.integration

HASH = "sha256:" + "a" * 64  # the adapters' base model hash: nothing here compares it

N_ADAPTERS = 12


async def _owned(pool: asyncpg.Pool, replica_id: str) -> set[str]:
    rows = await pool.fetch(
        "SELECT adapter_id FROM placements WHERE replica_id = $1 AND role = 'owner'", replica_id
    )
    return {r["adapter_id"] for r in rows}


async def _loads(pool: asyncpg.Pool, replica_id: str) -> int:
    return await pool.fetchval(
        """SELECT count(*) FROM outbox WHERE aggregate_type = 'replica.commands'
           AND payload->>'command' = 'load' AND payload->>'replica_id' = $1""",
        replica_id,
    )


async def _planned_since(pool: asyncpg.Pool, replica_id: str, since: datetime) -> bool:
    planned = await pool.fetchval("SELECT planned_through FROM replicas WHERE replica_id = $1", replica_id)
    return planned is not None and planned >= since


async def test_warming_restarting_and_draining_replicas(services, migrated_db, pool) -> None:
    run = uuid.uuid4().hex[:6]
    prefix = f"pl{run}-"
    a, b = f"{prefix}a", f"{prefix}b"
    adapters = [f"acme-{run}-{i}" for i in range(N_ADAPTERS)]
    await pool.execute("INSERT INTO tenants (tenant_id) VALUES ('acme')")
    await insert_ready_adapters(pool, [ReadyAdapter(x, "acme", HASH) for x in adapters])
    platform = services.settings().model_copy(update={"database_url": migrated_db})
    settings = PlacementSettings(
        group_id=f"test-lifecycle-{run}",
        replica_id_prefix=prefix,
        membership_ttl_s=10.0,
        tick_s=0.2,
        metrics_port=0,
    )
    stop, ready = asyncio.Event(), asyncio.Event()
    producer = make_producer(platform)
    await producer.start()
    status: dict[str, ReplicaStatus] = {}
    signed = SignedReplicas(migrated_db)
    for replica_id in (a, b):
        await signed.register(replica_id, f"http://{replica_id}")

    worker = asyncio.create_task(
        run_worker(PlacementConfig(platform, settings), stop, ready=ready, from_end=True)
    )
    beats = None
    try:
        await asyncio.wait_for(ready.wait(), 30)
        beats = asyncio.create_task(signed.report(producer, status, stop))

        # A replica that warms is a member: it owns every adapter (one replica), and is marked planned.
        since = datetime.now(UTC)
        status[a] = "warming"
        await wait_until(lambda: _planned_since(pool, a, since), "the warming replica to be planned for")
        assert await _owned(pool, a) == set(adapters)
        assert await _loads(pool, a) == N_ADAPTERS

        # Ready, then a second replica joins: two owners each, and it is planned for too.
        status[a] = "ready"
        since = datetime.now(UTC)
        status[b] = "warming"
        await wait_until(lambda: _planned_since(pool, b, since), "the second replica to be planned for")
        assert await _owned(pool, b) == set(adapters)
        status[b] = "ready"
        await asyncio.sleep(1.0)
        loads_before = await _loads(pool, b)

        # b restarts under its id (warming again within the TTL): membership does not change, yet every
        # adapter it owns is loaded again, and it is planned for again.
        since = datetime.now(UTC)
        status[b] = "warming"
        await wait_until(lambda: _planned_since(pool, b, since), "the restarted replica to be planned for")
        assert await _loads(pool, b) == loads_before + N_ADAPTERS
        assert await _owned(pool, b) == set(adapters)
        status[b] = "ready"

        # b drains: out of membership at once, its placements move to a.
        status[b] = "draining"
        await wait_until(lambda: _none_on(pool, b), "the draining replica's placements to move", 15)
        for x in adapters:
            assert await _owned_by(pool, x) == set(owners(x, [a], 2))
    finally:
        stop.set()
        if beats is not None:
            beats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beats
        await asyncio.gather(worker, return_exceptions=True)
        await producer.stop()


async def _none_on(pool: asyncpg.Pool, replica_id: str) -> bool:
    return not await _owned(pool, replica_id)


async def _owned_by(pool: asyncpg.Pool, adapter_id: str) -> set[str]:
    rows = await pool.fetch(
        "SELECT replica_id FROM placements WHERE adapter_id = $1 AND role = 'owner'", adapter_id
    )
    return {r["replica_id"] for r in rows}
