"""A placement worker behind its topics drops no replica, on the real Kafka and PostgreSQL: a burst of
completed requests keeps the worker busy for several membership TTLs while both replicas report on time;
their reports wait unread behind the burst, yet neither replica leaves the fleet, no placement moves and
no command is sent. Ages count only up to where the worker has read replica.state to its end
(lorafleet/feed.py)."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from harness.seed import ReadyAdapter, insert_ready_adapters
from lorafleet.kafka import make_producer
from placement_worker.config import PlacementConfig, PlacementSettings
from placement_worker.main import run_worker
from schemas.events import RequestCompleted
from schemas.topics import REQUESTS_COMPLETED
from tests.integration.signed_states import SignedReplicas
from tests.integration.waiting import wait_until

pytestmark = pytest.mark.integration

HASH = "sha256:" + "a" * 64  # the adapters' base model hash: nothing here compares it
TTL_S = 2.0
BURST = 10_000  # completed requests: each is a statement, several TTLs of work on two cores


async def _placements(pool: asyncpg.Pool, prefix: str) -> set[tuple[str, str]]:
    rows = await pool.fetch(
        "SELECT adapter_id, replica_id FROM placements WHERE starts_with(replica_id, $1)", prefix
    )
    return {(r["adapter_id"], r["replica_id"]) for r in rows}


async def _commands(pool: asyncpg.Pool, prefix: str) -> int:
    return await pool.fetchval(
        """SELECT count(*) FROM outbox WHERE aggregate_type = 'replica.commands'
           AND starts_with(payload->>'replica_id', $1)""",
        prefix,
    )


async def test_a_burst_that_keeps_the_worker_busy_for_several_ttls_drops_no_replica(
    services, migrated_db, pool
) -> None:
    run = uuid.uuid4().hex[:6]
    prefix = f"bk{run}-"
    replicas = [f"{prefix}a", f"{prefix}b"]
    adapters = [f"acme-{run}-{i}" for i in range(REQUESTS_COMPLETED.partitions)]
    await pool.execute("INSERT INTO tenants (tenant_id) VALUES ('acme')")
    await insert_ready_adapters(pool, [ReadyAdapter(x, "acme", HASH) for x in adapters])
    platform = services.settings().model_copy(update={"database_url": migrated_db})
    settings = PlacementSettings(
        group_id=f"test-backlog-{run}",
        replica_id_prefix=prefix,
        membership_ttl_s=TTL_S,
        tick_s=0.2,
        metrics_port=0,
    )
    stop, ready = asyncio.Event(), asyncio.Event()
    producer = make_producer(platform)
    await producer.start()
    signed = SignedReplicas(migrated_db)
    for replica_id in replicas:
        await signed.register(replica_id, f"http://{replica_id}")

    worker = asyncio.create_task(
        run_worker(PlacementConfig(platform, settings), stop, ready=ready, from_end=True)
    )
    reporter = None
    try:
        await asyncio.wait_for(ready.wait(), 30)
        # each replica's state every 0.3 s, whatever the worker is doing
        reporter = asyncio.create_task(signed.report(producer, dict.fromkeys(replicas, "ready"), stop))
        want = {(x, r) for x in adapters for r in replicas}
        await wait_until(lambda: _is(pool, prefix, want), "both replicas to own every adapter")
        await asyncio.sleep(1.0)  # the commands of that plan are written
        commands = await _commands(pool, prefix)

        marker = datetime.now(UTC) + timedelta(days=1)
        for i in range(BURST):
            done = RequestCompleted(
                request_id=f"{run}-{i}",
                tenant_id="acme",
                alias="acme/x",
                adapter_id=adapters[i % len(adapters)],
                replica_id=replicas[i % 2],
                status="ok",
            )
            await producer.send(done.topic.name, done.to_bytes(), key=done.key().encode())
        # then one marker at the end of each partition: the burst is worked off once all eight are applied
        for part, adapter in enumerate(adapters):
            done = RequestCompleted(
                request_id=f"{run}-end-{part}",
                tenant_id="acme",
                alias="acme/x",
                adapter_id=adapter,
                replica_id=replicas[0],
                status="ok",
                occurred_at=marker,
            )
            await producer.send(done.topic.name, done.to_bytes(), partition=part)
        await producer.flush()
        sent, unread_for = time.monotonic(), 0.0
        ended = """SELECT count(*) FROM placements
                   WHERE replica_id = $1 AND adapter_id = ANY($2::text[]) AND last_used_at = $3"""
        oldest = "SELECT min(last_seen) FROM replicas WHERE starts_with(replica_id, $1)"
        while await pool.fetchval(ended, replicas[0], adapters, marker) < len(adapters):
            assert await _placements(pool, prefix) == want, "a placement moved while the worker was behind"
            assert time.monotonic() - sent < 240, "the burst was not worked off"
            # how long the reports sent on time have waited behind the burst (both clocks are this machine's)
            unread_for = max(unread_for, time.time() - (await pool.fetchval(oldest, prefix)).timestamp())
            await asyncio.sleep(0.2)
        print(f"\nBACKLOG: reports waited up to {unread_for:.1f}s unread (TTL {TTL_S}s)")
        # past the TTL, a report aged by its arrival alone would have dropped its replica (the burst is read
        # as it is sent, so how far behind the worker falls varies: 2.7-9.1 s here)
        assert unread_for > TTL_S, "the burst did not put the worker behind: the test proves nothing"
        await asyncio.sleep(2 * TTL_S)  # caught up: ages count again, and both still report
        assert await _placements(pool, prefix) == want
        assert await _commands(pool, prefix) == commands
    finally:
        stop.set()
        if reporter is not None:
            reporter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reporter
        await asyncio.gather(worker, return_exceptions=True)
        await producer.stop()


async def _is(pool: asyncpg.Pool, prefix: str, want: set[tuple[str, str]]) -> bool:
    return await _placements(pool, prefix) == want
