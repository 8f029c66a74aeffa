"""The stats stream on the real Kafka and PostgreSQL: windows, alerts, autoscaling, restarts, redelivery.

Each test runs `lorafleet stats-stream` as its own process with 2 s windows and a unique app id, fleet
name and adapter/tenant/replica prefix, because other tests publish to the same topics.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import asyncpg
import pytest

from gateway.console import overview
from harness.ports import free_port
from lorafleet.config import PlatformSettings
from lorafleet.kafka import make_producer
from schemas.console import TenantStats
from schemas.events import (
    Alert,
    AutoscaleSignal,
    Event,
    ReplicaEvent,
    ReplicaState,
    RequestCompleted,
    parse_event,
)
from schemas.topics import ALERTS, AUTOSCALE_SIGNALS
from stats_stream.closing import output_id
from stats_stream.windows import from_ms, to_ms, window_start
from tests.integration.kafka_helpers import collect
from tests.integration.poison import future_version, poison_until_read, send, wait_dead_lettered
from tests.integration.signed_states import SignedReplicas

pytestmark = pytest.mark.integration

WINDOW_S = 2.0


class Stream:
    """A `lorafleet stats-stream` subprocess that can be killed and started again with the same state."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.env, self.log = env, log
        self.port = int(env["LORAFLEET_STATS_METRICS_PORT"])
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "lorafleet.cli", "stats-stream"], env=self.env, stdout=out, stderr=out
            )

    def metric(self, name: str) -> float:
        try:
            body = urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=2).read().decode()
        except OSError:
            return 0.0
        return sum(float(line.rsplit(" ", 1)[1]) for line in body.splitlines() if line.startswith(name))

    async def wait_for(self, name: str, at_least: float, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while self.metric(name) < at_least:
            assert self.proc is not None and self.proc.poll() is None, self.tail()
            assert time.monotonic() < deadline, f"{name} < {at_least}\n{self.tail()}"
            await asyncio.sleep(0.2)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def tail(self) -> str:
        return self.log.read_bytes().decode(errors="replace")[-4000:]


def stream_env(app_id: str, run: str, data_dir: Path) -> dict[str, str]:
    """The stats stream's settings for a test: its own app id and fleet, short windows and timeouts."""
    return {
        "LORAFLEET_STATS_APP_ID": app_id,
        "LORAFLEET_STATS_FLEET": f"fleet-{run}",
        "LORAFLEET_STATS_DATA_DIR": str(data_dir),
        "LORAFLEET_STATS_WINDOW_S": str(WINDOW_S),
        "LORAFLEET_STATS_GRACE_S": "0.5",
        "LORAFLEET_STATS_IDLE_CLOSE_S": "5",
        "LORAFLEET_STATS_TICK_S": "0.3",
        "LORAFLEET_STATS_SESSION_TIMEOUT_S": "6",
        "LORAFLEET_STATS_METRICS_PORT": str(free_port()),
    }


@pytest.fixture
def stream(services, migrated_db, tmp_path) -> Iterator[tuple[Stream, str]]:
    run = uuid.uuid4().hex[:8]
    env = {
        **os.environ,
        **services.env(),
        "LORAFLEET_DATABASE_URL": migrated_db,
        **stream_env(f"lorafleet-stats-test-{run}", run, tmp_path / "faust"),
    }
    s = Stream(env, tmp_path / "stats-stream.log")
    s.start()
    try:
        yield s, run
    finally:
        s.stop()


async def publish(bootstrap: str, events: list[Event], signed: SignedReplicas | None = None) -> None:
    """The events in order; with signed, each replica.state signed by its registered replica."""
    producer = make_producer(PlatformSettings(kafka_bootstrap=bootstrap))
    await producer.start()
    try:
        for e in events:
            value = e.to_bytes()
            headers = signed.headers(e, value) if signed and isinstance(e, ReplicaState) else None
            await producer.send(e.topic.name, value, key=e.key().encode(), headers=headers)
        await producer.flush()
    finally:
        await producer.stop()


async def until_believed(
    s: Stream, bootstrap: str, signed: SignedReplicas, states: list[ReplicaState], timeout: float = 60.0
) -> None:
    """Once the stream has read the states' fresh registrations (it re-reads them soon after an unknown
    id): an hour-old copy of each, signed, is believed and set aside as late, counting nothing."""
    late = 'lorafleet_stats_events_total{outcome="late",topic="replica.state"'
    before, deadline = s.metric(late), time.monotonic() + timeout
    old = [st.model_copy(update={"occurred_at": st.occurred_at - timedelta(hours=1)}) for st in states]
    while s.metric(late) < before + len(old):
        assert time.monotonic() < deadline, s.tail()
        await publish(bootstrap, old, signed)
        await asyncio.sleep(0.5)


def requests_for(
    run: str, adapter: str, tenant: str, n: int, at: datetime, **fields
) -> list[RequestCompleted]:
    return [
        RequestCompleted(
            occurred_at=at,
            request_id=f"req-{i}",
            tenant_id=tenant,
            alias=f"{tenant}/support:prod",
            adapter_id=adapter,
            replica_id=f"r-{run}-1",
            status="ok",
            **fields,
        )
        for i in range(n)
    ]


async def stats_row(
    database_url: str, adapter: str, window: datetime, timeout: float = 60.0
) -> asyncpg.Record:
    conn = await asyncpg.connect(database_url)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            row = await conn.fetchrow(
                "SELECT * FROM adapter_stats WHERE adapter_id = $1 AND window_start = $2", adapter, window
            )
            if row is not None:
                return row
            await asyncio.sleep(0.3)
        raise AssertionError(f"no adapter_stats row for {adapter} at {window}")
    finally:
        await conn.close()


async def tenant_figures(
    database_url: str, tenants: tuple[str, ...], timeout: float = 60.0
) -> list[TenantStats]:
    """The console's per-tenant figures (from tenant_stats) for these tenants, once all of them have a row."""
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=1)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = {t.tenant_id: t for t in await overview.tenant_stats(pool)}
            if all(t in found for t in tenants):
                return [found[t] for t in tenants]
            await asyncio.sleep(0.3)
        raise AssertionError(f"no tenant_stats rows for {tenants}")
    finally:
        await pool.close()


def mid_window() -> datetime:
    """A moment in the middle of the current window, so every event of a batch lands in one window."""
    now_ms = int(time.time() * 1000)
    size = int(WINDOW_S * 1000)
    return from_ms(window_start(now_ms, size) + size // 2)


async def test_a_window_becomes_stats_rows_alerts_and_an_autoscale_signal_counting_redeliveries_once(
    services, stream, migrated_db
) -> None:
    s, run = stream
    await s.wait_for("lorafleet_stats_ticks_total", 1)
    at = mid_window()
    tenant_slow, tenant_ok = f"slow-{run}", f"fine-{run}"
    slow = requests_for(
        run, f"a-{run}-slow", tenant_slow, 10, at, tier="remote", ttft_s=2.0, completion_tokens=20
    )
    hot = requests_for(
        run, f"a-{run}-hot", tenant_ok, 20, at, tier="gpu", ttft_s=0.05, completion_tokens=70, total_s=1.0
    )  # 20 * 70 tokens / 2 s = 700 tokens/s, over one replica's 640
    evictions = [
        ReplicaEvent(occurred_at=at, replica_id=f"r-{run}-1", kind="evict", adapter_id="x") for _ in range(20)
    ]
    states = [
        ReplicaState(occurred_at=at, replica_id=f"r-{run}-{i}", url=f"http://r{i}", queue_depth=30)
        for i in (1, 2)
    ]
    signed = SignedReplicas(migrated_db)
    for state in states:
        await signed.register(state.replica_id, state.url)
    await until_believed(s, services.kafka_bootstrap, signed, states)
    batch: list[Event] = slow + hot + evictions + states
    await publish(services.kafka_bootstrap, batch + batch, signed)  # every event delivered twice
    # Forged states, unsigned or for an id nobody registered, count for nothing: they would add a replica
    # and its queue to the signal.
    forged = [
        ReplicaState(occurred_at=at, replica_id=f"r-{run}-1", url="http://r1", queue_depth=500),
        ReplicaState(occurred_at=at, replica_id=f"r-{run}-9", url="http://r9", queue_depth=500),
    ]
    await publish(services.kafka_bootstrap, forged)

    window = from_ms(window_start(to_ms(at), int(WINDOW_S * 1000)))
    row_slow = await stats_row(migrated_db, f"a-{run}-slow", window)
    row_hot = await stats_row(migrated_db, f"a-{run}-hot", window)
    assert (row_slow["requests"], row_slow["gpu_hit_rate"]) == (10, 0.0)
    assert (row_hot["requests"], row_hot["gpu_hit_rate"]) == (20, 1.0)
    assert row_hot["tokens_per_s"] == pytest.approx(700.0)
    assert (row_slow["errors"], row_slow["p50_ttft_s"], row_slow["p95_ttft_s"]) == (0, 2.0, 2.0)
    assert (row_hot["errors"], row_hot["p95_ttft_s"]) == (0, 0.05)
    slow_t, fine_t = await tenant_figures(migrated_db, (tenant_slow, tenant_ok))  # what the console shows
    assert (slow_t.requests, slow_t.tokens, slow_t.p50_ttft_s, slow_t.p95_ttft_s) == (10, 200, 2.0, 2.0)
    assert (fine_t.requests, fine_t.tokens, fine_t.p95_ttft_s) == (20, 1400, 0.05)
    assert fine_t.tokens_per_s == pytest.approx(700.0)
    # the bill goes by request-seconds: only the hot tenant's requests took time
    assert slow_t.usd_per_million_tokens == 0.0
    assert fine_t.usd_per_million_tokens is not None and fine_t.usd_per_million_tokens > 0

    def mine(records: list) -> list[Alert]:
        return [
            e for e in (parse_event(r.value) for r in records) if isinstance(e, Alert) and run in e.subject
        ]

    alerts = mine(await collect(services.kafka_bootstrap, ALERTS.name, want=lambda rs: len(mine(rs)) >= 2))
    assert {(a.kind, a.subject) for a in alerts} == {("slo_ttft", tenant_slow), ("thrashing", f"r-{run}-1")}
    thrash = next(a for a in alerts if a.kind == "thrashing")
    assert thrash.value == pytest.approx(20 * 60 / WINDOW_S)  # 20 evictions counted once, not 40

    signal_id = output_id("autoscale", f"fleet-{run}", to_ms(window))
    records = await collect(
        services.kafka_bootstrap,
        AUTOSCALE_SIGNALS.name,
        want=lambda rs: any(parse_event(r.value).event_id == signal_id for r in rs),
    )
    sig = next(e for e in (parse_event(r.value) for r in records) if e.event_id == signal_id)
    assert isinstance(sig, AutoscaleSignal)
    assert sig.current_replicas == 2  # r-1 and r-2, not the forged r-9
    assert sig.desired_replicas == 12  # ceil(2 replicas x 30 queued / 5 per replica), no forged queue
    assert s.metric('lorafleet_stats_events_total{outcome="rejected",topic="replica.state"') >= len(forged)
    assert (f"a-{run}-hot", 2) in {(h.adapter_id, h.owners) for h in sig.hot_adapters}
    assert s.metric('lorafleet_stats_events_total{outcome="duplicate"') >= len(batch)


async def test_a_restart_mid_window_loses_no_counts_and_counts_nothing_twice(
    services, stream, migrated_db
) -> None:
    s, run = stream
    await s.wait_for("lorafleet_stats_ticks_total", 1)
    at = mid_window()
    adapter = f"a-{run}-restart"
    before = requests_for(run, adapter, f"t-{run}", 7, at, tier="gpu", ttft_s=0.1, completion_tokens=10)
    after = requests_for(run, adapter, f"t-{run}", 5, at, tier="ram", ttft_s=0.1, completion_tokens=10)

    await publish(services.kafka_bootstrap, before)
    await s.wait_for(
        'lorafleet_stats_events_total{outcome="counted",topic="requests.completed"}', len(before)
    )
    s.kill()  # abruptly, mid-window: the counted events live only in the changelog (or are replayed)
    await publish(services.kafka_bootstrap, after + before[:3])  # more of the window, and some redeliveries
    s.start()

    window = from_ms(window_start(to_ms(at), int(WINDOW_S * 1000)))
    row = await stats_row(migrated_db, adapter, window, timeout=90)
    assert row["requests"] == 12
    assert row["gpu_hit_rate"] == pytest.approx(7 / 12)


async def test_poison_on_a_source_is_dead_lettered_and_the_next_events_still_make_a_window(
    services, stream, migrated_db, pool
) -> None:
    s, run = stream
    # a new app id reads the shared sources from their beginning (tens of thousands of records) first
    await s.wait_for("lorafleet_stats_ticks_total", 1, timeout=480)
    topic, adapter = "requests.completed", f"a-{run}-after-poison"
    producer = make_producer(services.settings())
    await producer.start()
    try:
        key = f"req-{run}".encode()
        raw = await poison_until_read(producer, pool, "stats-stream", topic, key, timeout=120)
        at = mid_window()
        valid = requests_for(run, adapter, f"t-{run}", 3, at, tier="gpu", ttft_s=0.1, completion_tokens=10)
        future = await send(producer, topic, future_version(valid[0]), key)
        for event in valid:
            await send(producer, topic, event.to_bytes(), key)
    finally:
        await producer.stop()
    rows = await wait_dead_lettered(pool, "stats-stream", [raw, future])
    assert "schema_version" in rows[future]["reason"] and rows[raw]["value"].startswith(b"\xff\xfe")
    window = from_ms(window_start(to_ms(at), int(WINDOW_S * 1000)))
    assert (await stats_row(migrated_db, adapter, window))["requests"] == 3
    dead = f'lorafleet_consumer_dead_letters_total{{consumer="stats-stream",topic="{topic}"}}'
    assert s.metric(dead) >= 2


def refuse_stats_of(adapter_id: str) -> str:
    """A trigger that makes PostgreSQL refuse this adapter's adapter_stats rows with a data exception."""
    return f"""
CREATE FUNCTION refuse_stats() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.adapter_id = '{adapter_id}' THEN
        RAISE EXCEPTION 'injected fault' USING ERRCODE = '22023';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER refuse_stats BEFORE INSERT ON adapter_stats FOR EACH ROW EXECUTE FUNCTION refuse_stats();
"""


async def window_dead_letter(pool: asyncpg.Pool, topic: str, timeout: float = 90.0) -> asyncpg.Record:
    deadline = time.monotonic() + timeout
    while True:
        row = await pool.fetchrow(
            "SELECT * FROM dead_letters WHERE consumer = 'stats-stream' AND topic = $1", topic
        )
        if row is not None:
            return row
        assert time.monotonic() < deadline, f"no window dead-lettered on {topic}"
        await asyncio.sleep(0.3)


async def test_a_window_the_database_keeps_refusing_is_dead_lettered_and_the_next_window_closes(
    services, stream, migrated_db, pool
) -> None:
    """Well-formed requests, but PostgreSQL refuses their adapter's stats row (a data exception injected by a
    trigger, not an outage): the real stats stream tries the window's close three times, dead-letters it
    with its events and the error at the tick that closed it, and the next window still closes."""
    s, run = stream
    await s.wait_for("lorafleet_stats_ticks_total", 1, timeout=480)
    refused, fine = f"a-{run}-refused", f"a-{run}-fine"
    await pool.execute(refuse_stats_of(refused))
    at = mid_window()
    await publish(
        services.kafka_bootstrap, requests_for(run, refused, f"t-{run}", 2, at, completion_tokens=10)
    )
    fleet_topic = f"lorafleet-stats-test-{run}-fleet"  # the stream's own fleet topic: "<app id>-fleet"
    row = await window_dead_letter(pool, fleet_topic)
    assert "the handler failed 3 times: InvalidParameterValueError: injected fault" in row["reason"], row
    assert [e["adapter_id"] for e in json.loads(row["value"])] == [refused, refused]

    later = mid_window()
    assert window_start(to_ms(later), int(WINDOW_S * 1000)) > to_ms(at)
    await publish(
        services.kafka_bootstrap, requests_for(run, fine, f"t-{run}", 3, later, completion_tokens=10)
    )
    window = from_ms(window_start(to_ms(later), int(WINDOW_S * 1000)))
    assert (await stats_row(migrated_db, fine, window))["requests"] == 3
    dead = f'lorafleet_consumer_dead_letters_total{{consumer="stats-stream",topic="{fleet_topic}"}}'
    assert s.metric(dead) == 1
