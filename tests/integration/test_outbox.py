"""The transactional outbox: concurrent writers, the relay, late commits, dead letters, idempotent consumers."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid

import asyncpg
import pytest
from prometheus_client import REGISTRY

from lorafleet.config import RelaySettings
from lorafleet.kafka import make_producer
from lorafleet.outbox.idempotency import apply_once
from lorafleet.outbox.writer import emit, outbox_transaction
from relay.publisher import LEADER_LOCK_KEY, Relay
from schemas.events import AliasChanged, EventValidationError, parse_event
from schemas.topics import ALIASES_CHANGED
from tests.integration.kafka_helpers import collect
from tests.integration.waiting import wait_until

pytestmark = pytest.mark.integration


def alias_event(run: str, i: int) -> AliasChanged:
    return AliasChanged(
        alias=f"t{run}/support-{i % 7}:prod", tenant_id=f"t{run}", adapter_id=f"a-{i}", revision=i + 1
    )


async def _ids_of(records: list) -> list[str]:
    return [json.loads(r.value)["event_id"] for r in records]


@pytest.fixture
async def producer(services):
    p = make_producer(services.settings())
    await p.start()
    yield p
    await p.stop()


async def test_emit_writes_the_outbox_row_in_the_domain_transaction(pool: asyncpg.Pool) -> None:
    event = alias_event("x", 1)
    with pytest.raises(RuntimeError, match="inside the domain transaction"):
        async with pool.acquire() as conn:
            await emit(conn, event)
    with pytest.raises(ZeroDivisionError):
        async with outbox_transaction(pool) as conn:
            await emit(conn, event)
            raise ZeroDivisionError  # the domain work failed: its event must vanish with it
    assert await pool.fetchval("SELECT count(*) FROM outbox") == 0


async def test_an_invalid_event_is_rejected_before_it_reaches_the_outbox(pool: asyncpg.Pool) -> None:
    bad = AliasChanged.model_construct(alias="not an alias", tenant_id="acme", adapter_id="a", revision=0)
    with pytest.raises(EventValidationError):
        async with outbox_transaction(pool) as conn:
            await emit(conn, bad)
    assert await pool.fetchval("SELECT count(*) FROM outbox") == 0


async def test_relay_dead_letters_a_row_that_fails_validation_and_never_publishes_it(
    pool: asyncpg.Pool, producer, services
) -> None:
    bad_id = uuid.uuid4()
    await pool.execute(
        """INSERT INTO outbox (id, aggregate_type, aggregate_id, type, payload)
           VALUES ($1, 'aliases.changed', 'x', 'alias.changed', '{"alias": "NOT VALID"}'::jsonb)""",
        bad_id,
    )
    good = alias_event(uuid.uuid4().hex[:6], 1)
    async with outbox_transaction(pool) as conn:
        await emit(conn, good)
    relay = Relay(pool, producer, RelaySettings())
    dead_before = REGISTRY.get_sample_value("lorafleet_outbox_dead_lettered_total") or 0.0
    assert await relay.unsent() == 2
    await relay.publish_batch()
    assert REGISTRY.get_sample_value("lorafleet_outbox_dead_lettered_total") == dead_before + 1
    assert await relay.unsent() == 0
    row = await pool.fetchrow("SELECT sent_at, failed_at, error FROM outbox WHERE id = $1", bad_id)
    assert row["sent_at"] is None and row["failed_at"] is not None and "invalid" in row["error"]
    records = await collect(
        services.kafka_bootstrap,
        ALIASES_CHANGED.name,
        want=lambda rs: any(json.loads(r.value)["event_id"] == str(good.event_id) for r in rs),
        timeout=30,
    )
    ids = await _ids_of(records)
    assert str(good.event_id) in ids and str(bad_id) not in ids


async def test_a_thousand_concurrent_events_all_arrive_once_after_dedupe(pool, producer, services) -> None:
    run = uuid.uuid4().hex[:6]
    events = [alias_event(run, i) for i in range(1000)]

    async def write(chunk: list[AliasChanged]) -> None:
        for e in chunk:
            async with outbox_transaction(pool) as conn:
                await emit(conn, e)

    stop = asyncio.Event()
    relay_task = asyncio.create_task(Relay(pool, producer, RelaySettings(batch_size=200)).run(stop))
    await asyncio.gather(*(write(events[i::10]) for i in range(10)))
    wanted = {str(e.event_id) for e in events}
    records = await collect(
        services.kafka_bootstrap,
        ALIASES_CHANGED.name,
        want=lambda rs: wanted <= {json.loads(r.value)["event_id"] for r in rs},
        accept=lambda r: json.loads(r.value)["tenant_id"] == f"t{run}",
        timeout=90,
    )
    stop.set()
    await relay_task
    # apply each delivery through the idempotent consumer helper: exactly one effect per event
    await pool.execute("CREATE TABLE effects (event_id uuid)")
    for r in records:
        event = parse_event(r.value, ALIASES_CHANGED.name)
        async with pool.acquire() as conn:
            await apply_once(
                conn,
                "test",
                event.event_id,
                lambda c, e=event: c.execute("INSERT INTO effects VALUES ($1)", e.event_id),
            )
    assert await pool.fetchval("SELECT count(DISTINCT event_id) FROM effects") == 1000
    assert await pool.fetchval("SELECT count(*) FROM effects") == 1000
    assert await pool.fetchval("SELECT count(*) FROM outbox WHERE sent_at IS NULL") == 0
    # per-key order: each alias's events arrive in the order their transactions committed (outbox seq)
    seq_of = {str(r["id"]): r["seq"] for r in await pool.fetch("SELECT id, seq FROM outbox")}
    by_key: dict[str, list[int]] = {}
    for r in records:
        by_key.setdefault(r.key.decode(), []).append(seq_of[json.loads(r.value)["event_id"]])
    assert len(by_key) == 7
    assert all(seqs == sorted(seqs) for seqs in by_key.values())


async def test_a_transaction_that_commits_late_is_not_skipped(pool, producer, services) -> None:
    run = uuid.uuid4().hex[:6]
    early, late = alias_event(run, 1), alias_event(run, 2)
    relay = Relay(pool, producer, RelaySettings())
    slow = await pool.acquire()
    tx = slow.transaction()
    await tx.start()
    await emit(slow, early)  # takes the lower seq, but commits last
    async with outbox_transaction(pool) as conn:
        await emit(conn, late)
    await relay.publish_batch()  # publishes `late`; `early` is not visible yet
    await tx.commit()
    await pool.release(slow)
    await relay.publish_batch()
    wanted = {str(early.event_id), str(late.event_id)}
    records = await collect(
        services.kafka_bootstrap,
        ALIASES_CHANGED.name,
        want=lambda rs: wanted <= set(json.loads(r.value)["event_id"] for r in rs),
        timeout=30,
    )
    assert wanted <= set(await _ids_of(records))
    assert await pool.fetchval("SELECT count(*) FROM outbox WHERE sent_at IS NULL") == 0


async def test_writers_of_one_key_take_seq_in_commit_order(pool: asyncpg.Pool) -> None:
    """A second writer of a key waits for the first to commit; a writer of another key does not wait."""
    run = uuid.uuid4().hex[:6]
    first, same_key, other_key = alias_event(run, 0), alias_event(run, 7), alias_event(run, 1)
    assert first.key() == same_key.key() != other_key.key()
    holder = await pool.acquire()
    tx = holder.transaction()
    await tx.start()
    await emit(holder, first)

    async def write(event: AliasChanged) -> None:
        async with outbox_transaction(pool) as conn:
            await emit(conn, event)

    await asyncio.wait_for(write(other_key), timeout=30)  # another key is not held up
    queued = asyncio.create_task(write(same_key))

    async def waiting_on_the_key_lock() -> bool:
        return await _advisory_locks(pool, granted=False) == 1

    await wait_until(waiting_on_the_key_lock, "the same-key writer to queue on the key lock")
    assert not queued.done()
    await tx.commit()
    await pool.release(holder)
    await asyncio.wait_for(queued, timeout=30)
    seq = {str(r["id"]): r["seq"] for r in await pool.fetch("SELECT id, seq FROM outbox")}
    assert seq[str(first.event_id)] < seq[str(same_key.event_id)]


async def test_the_relay_sets_the_event_id_header_and_the_aggregate_key(pool, producer, services) -> None:
    event = alias_event(uuid.uuid4().hex[:6], 3)
    async with outbox_transaction(pool) as conn:
        await emit(conn, event)
    await Relay(pool, producer, RelaySettings()).publish_batch()
    records = await collect(
        services.kafka_bootstrap,
        ALIASES_CHANGED.name,
        want=lambda rs: bool(rs),
        accept=lambda r: json.loads(r.value)["event_id"] == str(event.event_id),
    )
    (record,) = records
    assert dict(record.headers)["id"] == str(event.event_id).encode()
    assert record.key == event.alias.encode()


async def test_a_second_relay_stands_by_while_the_first_holds_the_outbox(
    pool, producer, services, caplog: pytest.LogCaptureFixture
) -> None:
    """Only one relay publishes at a time (per-key order); the other takes over when the first stops."""
    caplog.set_level(logging.INFO, logger="relay.publisher")
    stop_a, stop_b = asyncio.Event(), asyncio.Event()
    a = Relay(pool, producer, RelaySettings(poll_interval_s=0.05))
    b = Relay(pool, producer, RelaySettings(poll_interval_s=0.05))
    task_a = asyncio.create_task(a.run(stop_a))

    async def a_leads() -> bool:
        return await _advisory_locks(pool, granted=True, key=LEADER_LOCK_KEY) == 1

    async def b_stands_by() -> bool:
        return any("standing by" in r.getMessage() for r in caplog.records)

    await wait_until(a_leads, "the first relay to take the outbox")
    task_b = asyncio.create_task(b.run(stop_b))
    await wait_until(b_stands_by, "the second relay to find the outbox taken")
    first = alias_event(uuid.uuid4().hex[:6], 1)
    async with outbox_transaction(pool) as conn:
        await emit(conn, first)

    async def published(relay: Relay) -> bool:
        return relay.stats.published > 0

    await wait_until(lambda: published(a), "the leading relay to publish", timeout=30)
    assert a.stats.published == 1 and b.stats.published == 0
    stop_a.set()
    await task_a
    second = alias_event(uuid.uuid4().hex[:6], 2)
    async with outbox_transaction(pool) as conn:
        await emit(conn, second)
    await wait_until(lambda: published(b), "the standing-by relay to take over", timeout=30)
    stop_b.set()
    await task_b
    assert a.stats.published == 1 and b.stats.published == 1


async def _advisory_locks(pool: asyncpg.Pool, granted: bool, key: int | None = None) -> int:
    """Advisory locks held (or waited for) in this test's database; pg_locks lists every database's."""
    return await pool.fetchval(
        """SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted = $1
           AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
           AND ($2::bigint IS NULL OR (classid::bigint << 32 | objid::bigint) = $2)""",
        granted,
        key,
    )
