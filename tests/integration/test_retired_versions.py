"""Retired versions on the real PostgreSQL and Kafka: the mark a trigger keeps on every alias move (003), its
backfill on a database that already has data, and a placement worker that never places or re-loads a
retired version, across a restart, while a rollback places the version again."""

from __future__ import annotations

import asyncio
import json
import shutil
import uuid
from importlib import resources
from pathlib import Path

import asyncpg
import pytest

from gateway.errors import InvalidRegistration
from gateway.registry.aliases import set_alias
from harness.seed import ReadyAdapter, insert_ready_adapters
from lorafleet.config import RelaySettings
from lorafleet.db.migrate import migrate
from lorafleet.kafka import make_producer
from placement_worker.config import PlacementConfig, PlacementSettings
from placement_worker.main import run_worker
from relay.publisher import Relay
from schemas.api import CanaryTarget
from schemas.events import AdapterValidated, Event, ReplicaState
from schemas.rendezvous import owners
from tests.integration.signed_states import SignedReplicas
from tests.integration.waiting import wait_until

pytestmark = pytest.mark.integration

HASH = "sha256:" + "a" * 64


async def _versions(pool: asyncpg.Pool | asyncpg.Connection, *ids: str) -> None:
    await insert_ready_adapters(pool, [ReadyAdapter(a, "acme", HASH, i + 1) for i, a in enumerate(ids)])


async def _retired(pool: asyncpg.Pool | asyncpg.Connection) -> set[str]:
    return {r["adapter_id"] for r in await pool.fetch("SELECT adapter_id FROM retired_versions")}


async def test_every_move_away_retires_and_a_rollback_or_a_second_alias_un_retires(
    pool: asyncpg.Pool,
) -> None:
    await pool.execute("INSERT INTO tenants (tenant_id) VALUES ('acme')")
    await _versions(pool, "v1", "v2", "v3")
    for target in ("v1", "v2", "v3"):
        await set_alias(pool, "acme/app:prod", target)
    assert await _retired(pool) == {"v1", "v2"}  # the alias row remembers only v2 as previous
    await set_alias(pool, "acme/app:prod", "v2")  # rollback
    assert await _retired(pool) == {"v1", "v3"}
    await set_alias(pool, "acme/app:canary", "v1")  # another alias points at v1: it serves again
    await set_alias(pool, "acme/app:prod", "v1")  # moving prod onto v1 retires v2; v1 is still aliased
    assert await _retired(pool) == {"v2", "v3"}
    await set_alias(pool, "acme/app:canary", "v3")  # v1 keeps prod
    assert await _retired(pool) == {"v2"}
    await pool.execute("DELETE FROM aliases WHERE alias = 'acme/app:canary'")  # no alias left on v3
    assert await _retired(pool) == {"v2", "v3"}


async def test_two_aliases_moving_off_one_version_at_once_retire_it(pool: asyncpg.Pool) -> None:
    await pool.execute("INSERT INTO tenants (tenant_id) VALUES ('acme')")
    await _versions(pool, "x", "y", "z")
    for alias in ("acme/a:prod", "acme/b:prod"):
        await set_alias(pool, alias, "x")
    one, two = await pool.acquire(), await pool.acquire()
    try:
        tx1, tx2 = one.transaction(), two.transaction()
        await tx1.start()
        await tx2.start()
        await one.execute("UPDATE aliases SET adapter_id = 'y' WHERE alias = 'acme/a:prod'")
        # The second move waits for the first to decide; it then sees it and retires x. Without the lock,
        # each would still see the other's alias on x and neither would retire it.
        second = asyncio.create_task(
            two.execute("UPDATE aliases SET adapter_id = 'z' WHERE alias = 'acme/b:prod'")
        )

        async def second_waits_on_a_lock() -> bool:
            return bool(
                await pool.fetchval(
                    """SELECT count(*) FROM pg_stat_activity
                       WHERE datname = current_database() AND wait_event_type = 'Lock'"""
                )
            )

        await wait_until(second_waits_on_a_lock, "the second move to wait for the first")
        assert not second.done()
        await tx1.commit()
        await asyncio.wait_for(second, 10)
        await tx2.commit()
    finally:
        await pool.release(one)
        await pool.release(two)
    assert await _retired(pool) == {"x"}


async def test_the_migration_backfills_moves_made_before_it_on_a_database_with_data(
    fresh_db: str, tmp_path: Path
) -> None:
    folder = tmp_path / "sql"
    shutil.copytree(str(resources.files("schemas") / "sql"), folder)
    held = {p: p.read_text() for p in folder.glob("*.sql") if p.name >= "003"}  # 003 and every later one
    for later in held:
        later.unlink()
    assert await migrate(fresh_db, folder) == [1, 2]
    conn = await asyncpg.connect(fresh_db)
    try:
        await conn.execute("INSERT INTO tenants (tenant_id) VALUES ('acme')")
        await _versions(conn, "v1", "v2", "v3", "w1")
        # prod went v1 -> v2 -> v3 (only v2 is left in the row; v1 only in the outbox); canary is on w1
        await conn.execute(
            """INSERT INTO aliases (alias, tenant_id, adapter_id, previous_adapter_id, revision) VALUES
               ('acme/app:prod', 'acme', 'v3', 'v2', 3), ('acme/app:canary', 'acme', 'w1', NULL, 1)"""
        )
        payload = {"alias": "acme/app:prod", "adapter_id": "v2", "previous_adapter_id": "v1", "revision": 2}
        await conn.execute(
            """INSERT INTO outbox (id, aggregate_type, aggregate_id, type, payload)
               VALUES ($1, 'aliases.changed', 'acme/app:prod', 'alias.changed', $2::jsonb)""",
            uuid.uuid4(),
            json.dumps(payload),
        )
        for later, text in held.items():
            later.write_text(text)
        assert (await migrate(fresh_db, folder))[0] == 3
        assert await _retired(conn) == {"v1", "v2"}
        await conn.execute("UPDATE aliases SET adapter_id = 'v1' WHERE alias = 'acme/app:prod'")
        assert await _retired(conn) == {"v2", "v3"}
    finally:
        await conn.close()


async def test_a_replan_never_places_a_retired_version_and_a_rollback_places_it_again(
    services, migrated_db: str, pool: asyncpg.Pool
) -> None:
    run = uuid.uuid4().hex[:6]
    prefix = f"t{run}-r"
    replicas = [f"{prefix}{i}" for i in range(3)]
    v1, v2, v3 = (f"acme-{run}-v{i}" for i in (1, 2, 3))
    alias = "acme/app:prod"
    await pool.execute("INSERT INTO tenants (tenant_id) VALUES ('acme')")
    await _versions(pool, v1, v2, v3)
    platform = services.settings().model_copy(update={"database_url": migrated_db})
    settings = PlacementSettings(
        group_id=f"test-retired-{run}", replica_id_prefix=prefix, membership_ttl_s=5.0, tick_s=0.2
    )
    stop_all = asyncio.Event()
    producer = make_producer(platform)
    await producer.start()

    signed = SignedReplicas(migrated_db)
    for r in replicas:
        await signed.register(r, f"http://{r}")

    async def send(event: Event) -> None:
        await signed.send(producer, event)

    async def heartbeat() -> None:
        while not stop_all.is_set():
            for r in replicas:
                await send(ReplicaState(replica_id=r, url=f"http://{r}"))
            await asyncio.sleep(0.4)

    def worker(stop: asyncio.Event, ready: asyncio.Event) -> asyncio.Task:
        return asyncio.create_task(
            run_worker(PlacementConfig(platform, settings), stop, ready, from_end=True)
        )

    relay = asyncio.create_task(Relay(pool, producer, RelaySettings(poll_interval_s=0.05)).run(stop_all))
    beats = asyncio.create_task(heartbeat())
    stop1, ready1 = asyncio.Event(), asyncio.Event()
    first = worker(stop1, ready1)
    try:
        await asyncio.wait_for(ready1.wait(), 30)
        await _wait(lambda: _members(pool, prefix, 3), "3 replicas")
        for v in (v1, v2, v3):
            await send(AdapterValidated(adapter_id=v, tenant_id="acme", version=1, status="ready"))
        await _wait(lambda: _placed(pool, {v1, v2, v3}), "three versions placed")
        for v in (v1, v2, v3):  # deploy v1, then v2, then v3: through the gateway's alias code and outbox
            await set_alias(pool, alias, v)
        await _wait(lambda: _placed(pool, {v3}), "v1 and v2 unloaded, v3 placed")
        assert await _retired(pool) == {v1, v2}

        # Restart: the new worker replans everything at start; neither v1 nor v2 is placed or loaded again.
        stop1.set()
        await asyncio.wait_for(first, 30)
        loads_before = {v: await _commands(pool, "load", v) for v in (v1, v2)}
        stop2, ready2 = asyncio.Event(), asyncio.Event()
        second = worker(stop2, ready2)
        try:
            await asyncio.wait_for(ready2.wait(), 30)
            await asyncio.sleep(1.0)
            assert await _placed(pool, {v3})
            assert {v: await _commands(pool, "load", v) for v in (v1, v2)} == loads_before

            await set_alias(pool, alias, v2)  # rollback: v2 placed on its owners again, v3 retired
            await _wait(lambda: _placed(pool, {v2}), "v2 placed again, v3 unloaded")
            placed = await pool.fetch("SELECT replica_id FROM placements WHERE adapter_id = $1", v2)
            assert {r["replica_id"] for r in placed} == set(owners(v2, replicas, 2))
            assert await _commands(pool, "load", v2) == loads_before[v2] + 2
            assert await _retired(pool) == {v1, v3}

            # A canary on the retired v1 (not the alias's previous version) places it beside v2 and prewarms
            # it on its home (a share of the traffic: one GPU copy); ending the canary unloads it.
            prewarms = await _commands(pool, "prewarm", v1)
            await set_alias(pool, alias, v2, CanaryTarget(adapter_id=v1, weight=0.1))
            await _wait(lambda: _placed(pool, {v2, v1}), "the canary v1 placed beside v2")
            assert await _commands(pool, "prewarm", v1) == prewarms + 1
            unloads = await _commands(pool, "unload", v1)
            await set_alias(pool, alias, v2)
            await _wait(lambda: _placed(pool, {v2}), "the ended canary v1 unloaded")
            assert await _commands(pool, "unload", v1) == unloads + 2
            assert await _retired(pool) == {v1, v3}
        finally:
            stop2.set()
            await asyncio.wait_for(second, 30)
    finally:
        stop1.set()
        stop_all.set()
        beats.cancel()
        await asyncio.gather(beats, relay, first, return_exceptions=True)
        await producer.stop()


async def _wait(pred, what: str) -> None:  # noqa: ANN001
    await wait_until(pred, what, timeout=30.0)


async def _members(pool: asyncpg.Pool, prefix: str, n: int) -> bool:
    return await pool.fetchval("SELECT count(*) FROM replicas WHERE starts_with(replica_id, $1)", prefix) == n


async def _placed(pool: asyncpg.Pool, adapter_ids: set[str]) -> bool:
    rows = await pool.fetch("SELECT adapter_id, count(*) AS n FROM placements GROUP BY adapter_id")
    return {r["adapter_id"]: r["n"] for r in rows} == {a: 2 for a in adapter_ids}


async def _commands(pool: asyncpg.Pool, command: str, adapter_id: str) -> int:
    return await pool.fetchval(
        """SELECT count(*) FROM outbox WHERE aggregate_type = 'replica.commands'
           AND payload->>'command' = $1 AND payload->>'adapter_id' = $2""",
        command,
        adapter_id,
    )


async def test_a_canary_counts_as_pointed_at_and_an_ended_canary_retires(pool: asyncpg.Pool) -> None:
    await pool.execute("INSERT INTO tenants (tenant_id) VALUES ('acme')")
    await _versions(pool, "c1", "c2", "c3")
    await set_alias(pool, "acme/app:prod", "c1")
    view, changed = await set_alias(pool, "acme/app:prod", "c1", CanaryTarget(adapter_id="c2", weight=0.1))
    assert changed and (view.canary_adapter_id, view.canary_weight, view.previous_adapter_id) == (
        "c2",
        0.1,
        None,
    )
    assert await _retired(pool) == set()
    _, again = await set_alias(pool, "acme/app:prod", "c1", CanaryTarget(adapter_id="c2", weight=0.1))
    assert not again  # the same split changes nothing
    reweighted, changed = await set_alias(
        pool, "acme/app:prod", "c1", CanaryTarget(adapter_id="c2", weight=0.5)
    )
    assert changed and reweighted.revision == view.revision + 1
    ended, _ = await set_alias(pool, "acme/app:prod", "c1")  # a plain PUT ends the canary
    assert ended.canary_adapter_id is None and ended.canary_weight is None
    assert await _retired(pool) == {"c2"}
    await set_alias(pool, "acme/app:prod", "c1", CanaryTarget(adapter_id="c2", weight=0.25))
    assert await _retired(pool) == set()  # canarying a version again un-retires it
    promoted, _ = await set_alias(pool, "acme/app:prod", "c2")  # the canary becomes the version
    assert (promoted.adapter_id, promoted.previous_adapter_id, promoted.canary_adapter_id) == (
        "c2",
        "c1",
        None,
    )
    assert await _retired(pool) == {"c1"}
    with pytest.raises(InvalidRegistration):
        await set_alias(pool, "acme/app:prod", "c2", CanaryTarget(adapter_id="c2", weight=0.5))
    with pytest.raises(asyncpg.CheckViolationError):  # the table holds the rules too, for operators' SQL
        await pool.execute("UPDATE aliases SET canary_adapter_id = 'c3' WHERE alias = 'acme/app:prod'")
