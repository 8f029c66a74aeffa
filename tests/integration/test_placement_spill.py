"""Spill placements on the real Kafka and PostgreSQL: a copy a replica holds without owning it gets a `spill`
row at the tier it is in, completed requests keep its last use, and it goes when it is evicted, when it idles
(unloaded), when its replica leaves (no command) and when its version retires (unloaded)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from gateway.registry.aliases import set_alias
from harness.seed import ReadyAdapter, insert_ready_adapters
from lorafleet.config import RelaySettings
from lorafleet.kafka import make_producer
from placement_worker.config import PlacementConfig, PlacementSettings
from placement_worker.main import run_worker
from relay.publisher import Relay
from schemas.events import AdapterValidated, Event, ReplicaState, RequestCompleted
from schemas.rendezvous import owners
from tests.integration.signed_states import SignedReplicas
from tests.integration.waiting import wait_until

pytestmark = pytest.mark.integration

HASH = "sha256:" + "a" * 64
# Membership and idleness are judged on event times against the worker's clock, so a worker that falls
# behind (a loaded machine) sees them late: heartbeats and uses come far more often than these expire.
HEARTBEAT_EVERY_S, MEMBERSHIP_TTL_S = 0.3, 5.0
USE_EVERY_S, SPILL_IDLE_S = 1.0, 6.0


async def test_spill_copies_are_recorded_kept_by_use_and_cleaned_up(
    services, migrated_db: str, pool: asyncpg.Pool
) -> None:
    run = uuid.uuid4().hex[:6]
    prefix = f"t{run}-r"
    replicas = [f"{prefix}{i}" for i in range(5)]
    hot, v2 = f"acme-{run}-hot", f"acme-{run}-v2"
    await pool.execute("INSERT INTO tenants (tenant_id) VALUES ('acme')")
    await insert_ready_adapters(pool, [ReadyAdapter(hot, "acme", HASH), ReadyAdapter(v2, "acme", HASH, 2)])
    platform = services.settings().model_copy(update={"database_url": migrated_db})
    settings = PlacementSettings(
        group_id=f"test-spill-{run}",
        replica_id_prefix=prefix,
        membership_ttl_s=MEMBERSHIP_TTL_S,
        tick_s=0.2,
        spill_idle_s=SPILL_IDLE_S,
    )
    owner_ids = owners(hot, replicas, 2)
    spill, leaver = [r for r in replicas if r not in owner_ids][:2]
    holds: dict[str, tuple[list[str], list[str]]] = {r: ([], []) for r in replicas}  # (gpu, ram)
    alive = set(replicas)
    stop, ready = asyncio.Event(), asyncio.Event()
    producer = make_producer(platform)
    await producer.start()

    signed = SignedReplicas(migrated_db)
    for r in replicas:
        await signed.register(r, f"http://{r}")

    async def send(event: Event) -> None:
        await signed.send(producer, event)

    async def heartbeat() -> None:
        while not stop.is_set():
            for r in sorted(alive):
                gpu, ram = holds[r]
                await send(ReplicaState(replica_id=r, url=f"http://{r}", gpu_adapters=gpu, ram_adapters=ram))
            await asyncio.sleep(HEARTBEAT_EVERY_S)

    relay = asyncio.create_task(Relay(pool, producer, RelaySettings(poll_interval_s=0.05)).run(stop))
    worker = asyncio.create_task(
        run_worker(PlacementConfig(platform, settings), stop, ready=ready, from_end=True)
    )
    beats = None
    try:
        await asyncio.wait_for(ready.wait(), 30)
        beats = asyncio.create_task(heartbeat())
        await wait_until(lambda: _count(pool, "SELECT count(*) FROM replicas", 5), "5 replicas")
        for adapter_id in (hot, v2):
            await send(AdapterValidated(adapter_id=adapter_id, tenant_id="acme", version=1, status="ready"))
        await wait_until(lambda: _roles(pool, hot, {r: ("owner", "ram") for r in owner_ids}), "the owners")
        # (placements moved while the replicas joined one by one: count commands from here on)
        base = {r: await _commands(pool, "unload", hot, r) for r in (spill, leaver)}

        # Both owners were busy, the router spilled to a non-owner, which loaded the adapter into a slot.
        for r in owner_ids:
            holds[r] = ([hot], [hot])
        holds[spill] = ([hot], [hot])
        want = {**{r: ("owner", "ram") for r in owner_ids}, spill: ("spill", "gpu")}
        await wait_until(lambda: _roles(pool, hot, want), "a spill row at the GPU tier")
        served = datetime.now(UTC)
        await send(_completed(hot, spill, served))
        await send(_completed(hot, owner_ids[0], served))
        await wait_until(lambda: _last_used(pool, hot, spill, served), "the spill copy's last use")
        await wait_until(lambda: _last_used(pool, hot, owner_ids[0], served), "the owner's last use")

        # A replayed old state that does not list it changes nothing; the copy moving to RAM is seen.
        await send(
            ReplicaState(
                replica_id=spill, url=f"http://{spill}", occurred_at=datetime(2020, 1, 1, tzinfo=UTC)
            )
        )
        holds[spill] = ([], [hot])
        await wait_until(lambda: _roles(pool, hot, {**want, spill: ("spill", "ram")}), "the spill row at RAM")

        # Used again and again: it stays. Then nobody uses it for spill_idle_s: unloaded there, row gone.
        for _ in range(4):  # each use well inside spill_idle_s of the last, however late it is handled
            await send(_completed(hot, spill, datetime.now(UTC)))
            await asyncio.sleep(USE_EVERY_S)
        assert (await _placements(pool, hot))[spill] == ("spill", "ram")
        assert await _commands(pool, "unload", hot, spill) == base[spill]
        await wait_until(
            lambda: _has_command(pool, "unload", hot, spill, base[spill] + 1), "an idle copy unloaded", 30
        )
        holds[spill] = ([], [])  # the replica drained and dropped it
        await wait_until(lambda: _no_row(pool, hot, spill), "the unloaded spill row to go")
        assert await _commands(pool, "unload", hot, spill) == base[spill] + 1

        # A spill copy on a replica that leaves the fleet is forgotten without a command.
        holds[leaver] = ([], [hot])
        await wait_until(lambda: _has_row(pool, hot, leaver), "a spill row on the leaving replica")
        alive.discard(leaver)
        await wait_until(lambda: _no_row(pool, hot, leaver), "the departed replica's spill row to go", 30)
        assert await _commands(pool, "unload", hot, leaver) == base[leaver]

        # A retired version's spill copy is unloaded with its owners.
        holds[spill] = ([hot], [hot])
        await wait_until(lambda: _has_row(pool, hot, spill), "a new spill row")
        for target in (hot, v2):
            await set_alias(pool, "acme/app:prod", target)
        await wait_until(
            lambda: _has_command(pool, "unload", hot, spill, 2), "the retired version's spill unloaded"
        )
        holds[spill] = ([], [hot])  # still listed while it drains: not recorded again
        await asyncio.sleep(1.0)
        assert await _placements(pool, hot) == {}
    finally:
        stop.set()
        if beats is not None:
            beats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beats
        await asyncio.gather(relay, worker)
        await producer.stop()


def _completed(adapter_id: str, replica_id: str, at: datetime) -> RequestCompleted:
    return RequestCompleted(
        request_id=uuid.uuid4().hex,
        tenant_id="acme",
        alias="acme/app:prod",
        adapter_id=adapter_id,
        replica_id=replica_id,
        tier="gpu",
        status="ok",
        occurred_at=at,
    )


async def _count(pool: asyncpg.Pool, sql: str, n: int) -> bool:
    return await pool.fetchval(sql) == n


async def _placements(pool: asyncpg.Pool, adapter_id: str) -> dict[str, tuple[str, str]]:
    rows = await pool.fetch("SELECT replica_id, role, tier FROM placements WHERE adapter_id = $1", adapter_id)
    return {r["replica_id"]: (r["role"], r["tier"]) for r in rows}


async def _roles(pool: asyncpg.Pool, adapter_id: str, want: dict[str, tuple[str, str]]) -> bool:
    return await _placements(pool, adapter_id) == want


async def _has_row(pool: asyncpg.Pool, adapter_id: str, replica_id: str) -> bool:
    return replica_id in await _placements(pool, adapter_id)


async def _no_row(pool: asyncpg.Pool, adapter_id: str, replica_id: str) -> bool:
    return replica_id not in await _placements(pool, adapter_id)


async def _last_used(pool: asyncpg.Pool, adapter_id: str, replica_id: str, at: datetime) -> bool:
    used = await pool.fetchval(
        "SELECT last_used_at FROM placements WHERE adapter_id = $1 AND replica_id = $2",
        adapter_id,
        replica_id,
    )
    return used is not None and abs(used - at) < timedelta(milliseconds=1)


async def _commands(pool: asyncpg.Pool, command: str, adapter_id: str, replica_id: str) -> int:
    return await pool.fetchval(
        """SELECT count(*) FROM outbox WHERE aggregate_type = 'replica.commands' AND payload->>'command' = $1
           AND payload->>'adapter_id' = $2 AND payload->>'replica_id' = $3""",
        command,
        adapter_id,
        replica_id,
    )


async def _has_command(
    pool: asyncpg.Pool, command: str, adapter_id: str, replica_id: str, n: int = 1
) -> bool:
    return await _commands(pool, command, adapter_id, replica_id) >= n
