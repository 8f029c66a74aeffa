"""The placement worker on the real Kafka and PostgreSQL: owners by rendezvous, a joining or leaving replica
moves only its own placements, traffic raises the owner count, alias changes prewarm, duplicates or
replays change nothing, and many replicas silent together are held before their placements move. Commands reach replica.commands keyed by replica id."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from datetime import UTC, datetime

import asyncpg
import pytest

from harness.seed import ReadyAdapter, insert_ready_adapters
from lorafleet.config import RelaySettings
from lorafleet.kafka import make_producer
from placement_worker.config import PlacementConfig, PlacementSettings
from placement_worker.main import run_worker
from relay.publisher import Relay
from schemas.events import AdapterStats, AdapterValidated, AliasChanged, Event, ReplicaState
from schemas.rendezvous import owners
from tests.integration.kafka_helpers import collect
from tests.integration.signed_states import SignedReplicas
from tests.integration.waiting import wait_until

pytestmark = pytest.mark.integration

HASH = "sha256:" + "a" * 64  # the adapters' base model hash: nothing here compares it

N_ADAPTERS = 60
# Membership is judged on heartbeat times against the worker's clock, so a worker that falls behind (a
# loaded machine) sees them late: heartbeats come far more often than they expire.
HEARTBEAT_EVERY_S, MEMBERSHIP_TTL_S, SILENCE_HOLD_S = 0.4, 5.0, 3.0


async def _placements(pool: asyncpg.Pool) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for r in await pool.fetch("SELECT adapter_id, replica_id, tier FROM placements"):
        out.setdefault(r["adapter_id"], {})[r["replica_id"]] = r["tier"]
    return out


async def _commands(pool: asyncpg.Pool) -> int:
    return await pool.fetchval("SELECT count(*) FROM outbox WHERE aggregate_type = 'replica.commands'")


async def test_placement_follows_membership_traffic_and_aliases(services, migrated_db, pool) -> None:
    run = uuid.uuid4().hex[:6]
    prefix = f"t{run}-r"
    replicas = [f"{prefix}{i}" for i in range(5)]
    adapters = [f"acme-{run}-a{i}" for i in range(N_ADAPTERS)]
    await pool.execute("INSERT INTO tenants (tenant_id) VALUES ('acme')")
    await insert_ready_adapters(pool, [ReadyAdapter(a, "acme", HASH) for a in adapters])
    platform = services.settings().model_copy(update={"database_url": migrated_db})
    settings = PlacementSettings(
        group_id=f"test-placement-{run}",
        replica_id_prefix=prefix,
        membership_ttl_s=MEMBERSHIP_TTL_S,
        silence_hold_s=SILENCE_HOLD_S,
        tick_s=0.2,
    )
    stop, ready = asyncio.Event(), asyncio.Event()
    producer = make_producer(platform)
    await producer.start()
    alive = set(replicas)
    signed = SignedReplicas(migrated_db)
    for r in replicas:
        await signed.register(r, f"http://{r}")

    async def send(event: Event) -> None:
        await signed.send(producer, event)

    async def heartbeat() -> None:
        while not stop.is_set():
            for r in sorted(alive):
                await send(ReplicaState(replica_id=r, url=f"http://{r}", gpu_slots=16))
            await asyncio.sleep(HEARTBEAT_EVERY_S)

    relay = asyncio.create_task(Relay(pool, producer, RelaySettings(poll_interval_s=0.05)).run(stop))
    worker = asyncio.create_task(
        run_worker(PlacementConfig(platform, settings), stop, ready=ready, from_end=True)
    )
    beats = None
    try:
        await asyncio.wait_for(ready.wait(), 30)
        beats = asyncio.create_task(heartbeat())
        await wait_until(lambda: _member_count(pool, prefix, 5), what="5 replicas in the replicas table")
        validated = [
            AdapterValidated(adapter_id=a, tenant_id="acme", version=1, status="ready") for a in adapters
        ]
        for event in validated:
            await send(event)

        async def all_placed() -> bool:
            return sum(len(v) for v in (await _placements(pool)).values()) == 2 * N_ADAPTERS

        await wait_until(all_placed, what="two owners per adapter")
        before = await _placements(pool)
        for a in adapters:
            assert set(before[a]) == set(owners(a, replicas, 2)), a

        # Duplicates and replays: the same events again change nothing.
        n_commands = await _commands(pool)
        for event in validated[:10]:
            await send(event)
        await send(
            ReplicaState(
                replica_id=replicas[0],
                url=f"http://{replicas[0]}",
                status="draining",
                occurred_at=datetime(2020, 1, 1, tzinfo=UTC),
            )
        )
        await asyncio.sleep(1.0)
        assert await _placements(pool) == before and await _commands(pool) == n_commands

        # Forged states (unsigned, or for an id nobody registered) move nothing: a replica made to drain, or
        # one that was never started, would take or give placements.
        for forged in (
            ReplicaState(replica_id=replicas[0], url=f"http://{replicas[0]}", status="draining"),
            ReplicaState(replica_id=f"{prefix}forged", url="http://127.0.0.1:1", gpu_slots=16),
        ):
            for _ in range(3):
                await producer.send_and_wait(forged.topic.name, forged.to_bytes(), key=forged.key().encode())
        await asyncio.sleep(1.5)
        assert await _placements(pool) == before and await _commands(pool) == n_commands
        assert not await pool.fetchval(
            "SELECT count(*) FROM replicas WHERE replica_id = $1", f"{prefix}forged"
        )

        # A replica joins: only the placements it wins move, and they move to it.
        new = f"{prefix}new"
        await signed.register(new, f"http://{new}")
        alive.add(new)
        grown = [*replicas, new]
        gains = [a for a in adapters if new in owners(a, grown, 2)]

        async def joined() -> bool:
            return sum(new in v for v in (await _placements(pool)).values()) == len(gains)

        await wait_until(joined, what="the new replica's placements")
        after_join = await _placements(pool)
        moved = [a for a in adapters if after_join[a] != before[a]]
        assert sorted(moved) == sorted(gains)
        assert 0 < len(moved) < 0.6 * N_ADAPTERS  # about 2/6 of adapters, one placement each
        assert all(set(after_join[a]) == set(owners(a, grown, 2)) for a in adapters)

        # A replica leaves (its heartbeats stop): only its placements move, to the next-ranked replica.
        gone = replicas[1]
        alive.discard(gone)
        shrunk = [r for r in grown if r != gone]
        await wait_until(
            lambda: _no_placements_on(pool, gone),
            timeout=30,
            what="the departed replica's placements to move",
        )
        after_leave = await _placements(pool)
        assert sorted(a for a in adapters if after_leave[a] != after_join[a]) == sorted(
            a for a in adapters if gone in after_join[a]
        )
        assert all(set(after_leave[a]) == set(owners(a, shrunk, 2)) for a in adapters)

        # Traffic raises the owner count and asks for GPU slots; a stale replayed window changes nothing.
        hot = adapters[0]
        now = datetime.now(UTC)
        stats = AdapterStats(
            adapter_id=hot,
            window_start=now,
            window_seconds=10,
            requests=100,
            tokens_per_s=2000,
            gpu_hit_rate=0.5,
        )
        await send(stats)

        async def hot_owned() -> bool:
            return len((await _placements(pool)).get(hot, {})) == 4

        await wait_until(hot_owned, what="4 owners for the hot adapter")
        assert set((await _placements(pool))[hot].values()) == {"gpu"}  # 2,000 tok/s: a GPU copy on all 4
        slots = "SELECT array_agg(DISTINCT gpu_slots) FROM replicas WHERE starts_with(replica_id, $1)"
        assert await pool.fetchval(slots, prefix) == [16]  # each replica's share was 16 x 0.25 = 4
        n_commands = await _commands(pool)
        await send(stats)
        await asyncio.sleep(0.8)
        assert await _commands(pool) == n_commands

        # A new alias prewarms its target on its home only: the first of its owners by rendezvous.
        target = adapters[1]
        await send(AliasChanged(alias="acme/support:prod", tenant_id="acme", adapter_id=target, revision=1))
        await wait_until(lambda: _command_count(pool, "prewarm", target, 1), what="prewarm command")
        home = owners(target, sorted((await _placements(pool))[target]), 1)
        assert await _prewarmed_on(pool, target) == home

        # An alias flip v1 -> v2 unloads v1 from its owners; a duplicate changes nothing; rollback reloads v1.
        v1, v2, alias = adapters[2], adapters[3], "acme/app:prod"
        await pool.execute(
            "INSERT INTO aliases (alias, tenant_id, adapter_id, revision) VALUES ($1, 'acme', $2, 1)",
            alias,
            v1,
        )
        await send(AliasChanged(alias=alias, tenant_id="acme", adapter_id=v1, revision=1))
        await wait_until(lambda: _command_count(pool, "prewarm", v1, 1), what="v1 prewarmed")
        v1_owners = (await _placements(pool))[v1]
        unloads_before = await _command_count(pool, "unload", v1)
        await _set_alias(pool, alias, v2, v1, 2)
        flip = AliasChanged(alias=alias, tenant_id="acme", adapter_id=v2, previous_adapter_id=v1, revision=2)
        await send(flip)
        # a deploy: v2 takes over v1's traffic, so every owner of v2 prewarms it
        await wait_until(lambda: _command_count(pool, "prewarm", v2, 2), what="v2 prewarmed")
        assert await _prewarmed_on(pool, v2) == sorted((await _placements(pool))[v2])
        assert v1 not in await _placements(pool)
        unloaded = await pool.fetch(
            """SELECT payload->>'replica_id' AS r FROM outbox WHERE aggregate_type = 'replica.commands'
               AND payload->>'command' = 'unload' AND payload->>'adapter_id' = $1""",
            v1,
        )
        assert len(unloaded) == unloads_before + 2 and {r["r"] for r in unloaded} >= set(v1_owners)
        placed, n_commands = await _placements(pool), await _commands(pool)
        await send(flip)
        await asyncio.sleep(0.8)
        assert await _placements(pool) == placed and await _commands(pool) == n_commands

        await _set_alias(pool, alias, v1, v2, 3)
        await send(
            AliasChanged(alias=alias, tenant_id="acme", adapter_id=v1, previous_adapter_id=v2, revision=3)
        )
        await wait_until(lambda: _command_count(pool, "prewarm", v1, 3), what="v1 prewarmed after rollback")
        rolled = await _placements(pool)
        assert set(rolled[v1]) == set(owners(v1, shrunk, 2)) and v2 not in rolled
        reloads = await pool.fetchval(
            """SELECT count(*) FROM outbox WHERE aggregate_type = 'replica.commands' AND payload->>'command' = 'load'
               AND payload->>'adapter_id' = $1 AND seq > (SELECT max(seq) FROM outbox WHERE
               payload->>'command' = 'unload' AND payload->>'adapter_id' = $1)""",
            v1,
        )
        assert reloads == 2

        # A canary on v1 once it serves traffic: a canary-only change leaves v1 the target, so v1 is prewarmed
        # on its home only, not again on every owner, and so is the canary.
        stats = AdapterStats(
            adapter_id=v1,
            window_start=datetime.now(UTC),
            window_seconds=10,
            requests=3,
            tokens_per_s=5.0,
            gpu_hit_rate=1.0,
        )
        await send(stats)
        recorded = "SELECT count(*) > 0 FROM adapter_stats WHERE adapter_id = $1"
        await wait_until(lambda: pool.fetchval(recorded, v1), what="v1's traffic recorded")
        canary = adapters[5]
        await pool.execute(
            "UPDATE aliases SET canary_adapter_id = $2, canary_weight = 0.1, revision = 4 WHERE alias = $1",
            alias,
            canary,
        )
        v1_prewarms = await _command_count(pool, "prewarm", v1)
        await send(
            AliasChanged(
                alias=alias,
                tenant_id="acme",
                adapter_id=v1,
                previous_adapter_id=v2,
                canary_adapter_id=canary,
                canary_weight=0.1,
                revision=4,
            )
        )
        await wait_until(lambda: _command_count(pool, "prewarm", canary, 1), what="the canary prewarmed")
        assert await _prewarmed_on(pool, canary) == owners(
            canary, sorted((await _placements(pool))[canary]), 1
        )
        assert await _command_count(pool, "prewarm", v1) == v1_prewarms + 1

        # The commands reached Kafka keyed by replica id.
        sent = "SELECT id FROM outbox WHERE aggregate_type = 'replica.commands' AND sent_at IS NOT NULL"
        await wait_until(lambda: _all_sent(pool), what="the relay to publish every command")
        ours = {str(r["id"]).encode() for r in await pool.fetch(sent)}
        records = await collect(
            platform.kafka_bootstrap,
            "replica.commands",
            lambda recs: len({dict(r.headers)["id"] for r in recs}) == len(ours),
            timeout=30,
            accept=lambda r: dict(r.headers).get("id") in ours,
        )
        assert {dict(r.headers)["id"] for r in records} == ours
        sample = json.loads(records[0].value)
        assert records[0].key.decode() == sample["replica_id"] and sample["command"] in {
            "load",
            "unload",
            "prewarm",
        }
        assert {json.loads(r.value)["command"] for r in records} >= {"load", "unload", "prewarm"}

        # Two of the five go silent together (40%): more likely a stall than two deaths, so they keep their
        # placements past the TTL, through the hold, and then lose them.
        quiet = shrunk[:2]
        placed = await _placements(pool)
        assert all(any(q in v for v in placed.values()) for q in quiet)
        alive.difference_update(quiet)
        silent_at = time.monotonic()
        await asyncio.sleep(MEMBERSHIP_TTL_S + 1.0)
        assert await _placements(pool) == placed  # past the TTL: held
        for q in quiet:
            await wait_until(lambda q=q: _no_placements_on(pool, q), timeout=30, what="the hold to end")
        assert time.monotonic() - silent_at >= MEMBERSHIP_TTL_S + SILENCE_HOLD_S
        left = [r for r in shrunk if r not in quiet]
        assert all(set(v) == set(owners(a, left, len(v))) for a, v in (await _placements(pool)).items())
    finally:
        stop.set()
        if beats is not None:
            beats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beats
        await asyncio.gather(relay, worker)
        await producer.stop()


async def _set_alias(pool: asyncpg.Pool, alias: str, adapter_id: str, previous: str, revision: int) -> None:
    """What the gateway's alias PUT writes (the worker reads the aliases table, not only the event)."""
    await pool.execute(
        "UPDATE aliases SET adapter_id = $2, previous_adapter_id = $3, revision = $4 WHERE alias = $1",
        alias,
        adapter_id,
        previous,
        revision,
    )


async def _command_count(pool: asyncpg.Pool, command: str, adapter_id: str, at_least: int | None = None):
    n = await pool.fetchval(
        """SELECT count(*) FROM outbox WHERE aggregate_type = 'replica.commands'
           AND payload->>'command' = $1 AND payload->>'adapter_id' = $2""",
        command,
        adapter_id,
    )
    return n if at_least is None else n >= at_least


async def _prewarmed_on(pool: asyncpg.Pool, adapter_id: str) -> list[str]:
    rows = await pool.fetch(
        """SELECT payload->>'replica_id' AS r FROM outbox WHERE aggregate_type = 'replica.commands'
           AND payload->>'command' = 'prewarm' AND payload->>'adapter_id' = $1 ORDER BY r""",
        adapter_id,
    )
    return [r["r"] for r in rows]


async def _member_count(pool: asyncpg.Pool, prefix: str, n: int) -> bool:
    return await pool.fetchval("SELECT count(*) FROM replicas WHERE starts_with(replica_id, $1)", prefix) == n


async def _no_placements_on(pool: asyncpg.Pool, replica_id: str) -> bool:
    return not await pool.fetchval("SELECT count(*) FROM placements WHERE replica_id = $1", replica_id)


async def _all_sent(pool: asyncpg.Pool) -> bool:
    return not await pool.fetchval(
        "SELECT count(*) FROM outbox WHERE aggregate_type = 'replica.commands' AND sent_at IS NULL"
    )
