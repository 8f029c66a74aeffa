"""The control plane survives PostgreSQL stopped (`-m fast` and `-m immediate`), Kafka stopped (SIGTERM and
SIGKILL) and PostgreSQL paused (SIGSTOP).

Each fault hits a private PostgreSQL or Kafka (harness/stacks/outage.py) under the real relay,
internal and public gateways, registry validator and placement worker, run by `lorafleet services
supervise`. During the fault: the public API answers known keys from its caches and anything else with a
503 in OpenAI's shape with Retry-After, never a 500, never past its deadline; a registration is accepted
(then durable in the outbox) or refused with a 503 and Retry-After. After it: every process runs and
every path works again within HEALTHY_WITHIN_S, with no manual step, and each registration's events are
on Kafka and applied exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import asyncpg
import httpx
import pytest
from aiokafka import TopicPartition
from aiokafka.partitioner import DefaultPartitioner

from gateway.config import GatewaySettings
from gateway.registry.served_base import served_base_hash
from gateway.tenants import create_key, create_tenant
from harness.seed import ReadyAdapter, insert_alias, insert_ready_adapters
from harness.stacks import outage as ostack
from lorafleet.kafka import make_admin
from ops.stack import kafka, postgres
from schemas.topics import ADAPTERS_REGISTERED, ADAPTERS_VALIDATED, BY_NAME
from tests.integration.kafka_helpers import read_to_end

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(ostack.missing_local_infra() is not None, reason=str(ostack.missing_local_infra())),
]

FAULT_S = 6.0  # each fault's length before the service is brought back
HANG_S = 15.0  # a request still unanswered after this counts as hung
PUBLIC_DEADLINE_S = 2.0 + 3.0  # db_read_deadline_s, plus slack for a loaded machine
INTERNAL_DEADLINE_S = 3.0 + 3.0 + 3.0  # db connect + command timeouts (as the test env sets them), plus slack
HEALTHY_WITHIN_S = 60.0
TENANT = "outage"
ALIAS = "outage/support:prod"


@dataclass
class Tally:
    """Status codes by kind of request during one fault, with the slowest answer of each kind."""

    codes: Counter = field(default_factory=Counter)
    slowest: dict[str, float] = field(default_factory=dict)
    malformed: list[str] = field(default_factory=list)
    refused: list[dict] = field(default_factory=list)  # registrations answered 503, to send again later

    def add(self, kind: str, status: int | str, seconds: float) -> None:
        self.codes[f"{kind} {status}"] += 1
        self.slowest[kind] = max(self.slowest.get(kind, 0.0), seconds)


@dataclass
class World:
    stack: ostack.Stack
    pool: asyncpg.Pool
    known_key: str
    fresh_keys: list[str]
    base_hash: str
    accepted: set[str] = field(default_factory=set)
    results: dict[str, dict] = field(default_factory=dict)


def _registration(base_hash: str) -> dict:
    adapter_id = f"out-{uuid.uuid4().hex[:10]}"
    return {
        "adapter_id": adapter_id,
        "tenant_id": TENANT,
        "version": 1,
        "base_model_hash": base_hash,
        "rank": 4,
        "alpha": 8.0,
        "target_modules": ["q_proj", "v_proj"],
        # no such object: the validator rejects it, which settles it all the same
        "weights_uri": f"s3://lorafleet-adapters/adapters/{TENANT}/{adapter_id}",
        "checksum": "sha256:" + "1" * 64,
    }


def _check_503(tally: Tally, kind: str, resp: httpx.Response) -> None:
    try:
        error = resp.json()["error"]
        shaped = {"message", "type", "code"} <= set(error) and error["code"] == "control_plane_unavailable"
    except (ValueError, KeyError, TypeError):
        shaped = False
    if not shaped or not resp.headers.get("retry-after", "").isdigit():
        tally.malformed.append(f"{kind}: {resp.headers.get('retry-after')} {resp.text[:200]}")


async def _timed(tally: Tally, kind: str, send: Callable) -> httpx.Response | None:
    started = time.monotonic()
    try:
        resp = await send()
    except httpx.TimeoutException:
        tally.add(kind, "hung", time.monotonic() - started)
        return None
    tally.add(kind, resp.status_code, time.monotonic() - started)
    if resp.status_code == 503:
        _check_503(tally, kind, resp)
    return resp


async def _traffic(world: World, tally: Tally, stop: asyncio.Event) -> None:
    """Until stop, three senders side by side, each about every 0.3 s: a known key, a key never seen
    before, and a registration (each a new adapter)."""
    stack = world.stack
    service = {"Authorization": f"Bearer {ostack.SERVICE_TOKEN}"}
    async with httpx.AsyncClient(timeout=HANG_S) as client:

        def models(key: str) -> Callable:
            return lambda: client.get(
                f"{stack.public_url}/v1/models", headers={"Authorization": f"Bearer {key}"}
            )

        async def known() -> None:
            await _timed(tally, "known-key", models(world.known_key))

        async def new_key() -> None:
            await _timed(tally, "new-key", models(world.fresh_keys.pop()))

        async def register() -> None:
            body = _registration(world.base_hash)
            resp = await _timed(
                tally,
                "registration",
                lambda: client.post(f"{stack.internal_url}/internal/adapters", json=body, headers=service),
            )
            if resp is not None and resp.status_code in (200, 202):
                world.accepted.add(body["adapter_id"])
            else:
                tally.refused.append(body)

        async def repeat(send: Callable) -> None:
            while not stop.is_set():
                await send()
                await asyncio.sleep(0.3)

        await asyncio.gather(repeat(known), repeat(new_key), repeat(register))


async def _healthy(world: World) -> bool:
    """Every process runs, a new key is served, and a new registration goes all the way through."""
    stack = world.stack
    if not stack.all_running():
        return False
    service = {"Authorization": f"Bearer {ostack.SERVICE_TOKEN}"}
    body = _registration(world.base_hash)
    try:
        async with httpx.AsyncClient(timeout=5) as c:
            fresh = world.fresh_keys.pop()
            seen = await c.get(f"{stack.public_url}/v1/models", headers={"Authorization": f"Bearer {fresh}"})
            if seen.status_code != 200:
                return False
            reg = await c.post(f"{stack.internal_url}/internal/adapters", json=body, headers=service)
            if reg.status_code != 202:
                return False
    except httpx.HTTPError:
        return False
    world.accepted.add(body["adapter_id"])
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        # validated by the registry validator, published by the relay, applied by the placement worker
        if await world.pool.fetchval(
            """SELECT count(*) FROM outbox o JOIN processed_events p
                 ON p.event_id = o.id AND p.consumer = 'placement-worker'
               WHERE o.aggregate_type = 'adapters.validated' AND o.aggregate_id = $1""",
            body["adapter_id"],
        ):
            return True
        await asyncio.sleep(0.2)
    return False


async def _time_to_healthy(world: World) -> float:
    started = time.monotonic()
    while time.monotonic() - started < HEALTHY_WITHIN_S:
        try:
            if await _healthy(world):
                return time.monotonic() - started
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            pass  # our own pool is coming back from the same outage
        await asyncio.sleep(0.2)
    logs = {name: ostack.tail(world.stack, name) for name in (*ostack.APPS, "supervisor")}
    raise AssertionError(f"not healthy within {HEALTHY_WITHIN_S}s: {world.stack.app_pids()}\n{logs}")


async def _resend_refused(world: World, tally: Tally) -> None:
    """What a client does after a 503 and Retry-After: send the registration again; now it is accepted."""
    service = {"Authorization": f"Bearer {ostack.SERVICE_TOKEN}"}
    async with httpx.AsyncClient(timeout=HANG_S) as c:
        for body in tally.refused:
            resp = await c.post(f"{world.stack.internal_url}/internal/adapters", json=body, headers=service)
            assert resp.status_code in (200, 202), resp.text
            world.accepted.add(body["adapter_id"])


async def _lost_and_doubled(world: World) -> tuple[int, int]:
    """Check each accepted registration's trail: outbox rows, Kafka records, apply_once records."""
    pool, bootstrap = world.pool, world.stack.settings.kafka_bootstrap

    async def settled() -> bool:
        """Nothing left to publish, validate or apply; until then a check would race the consumers."""
        return not await pool.fetchval(
            """SELECT count(*) FROM outbox o
               WHERE o.aggregate_id = ANY($1::text[])
                 AND o.aggregate_type IN ('adapters.registered', 'adapters.validated')
                 AND NOT EXISTS (
                   SELECT 1 FROM processed_events p WHERE p.event_id = o.id AND p.consumer =
                     CASE o.aggregate_type WHEN 'adapters.registered' THEN 'registry-validator'
                                           ELSE 'placement-worker' END)""",
            sorted(world.accepted),
        ) and not await pool.fetchval(
            "SELECT count(*) FROM adapters WHERE adapter_id = ANY($1::text[]) AND status = 'pending'",
            sorted(world.accepted),
        )

    deadline = time.monotonic() + HEALTHY_WITHIN_S
    while not await settled() and time.monotonic() < deadline:
        await asyncio.sleep(0.2)  # what is still missing at the deadline counts as lost below
    rows = await pool.fetch(
        """SELECT id::text AS id, aggregate_type AS topic, aggregate_id FROM outbox
           WHERE aggregate_id = ANY($1::text[])
             AND aggregate_type IN ('adapters.registered', 'adapters.validated')""",
        sorted(world.accepted),
    )
    by_type: dict[str, Counter] = {"adapters.registered": Counter(), "adapters.validated": Counter()}
    for r in rows:
        by_type[r["topic"]][r["aggregate_id"]] += 1
    consumer_of = {"adapters.registered": "registry-validator", "adapters.validated": "placement-worker"}
    applied = {
        (r["consumer"], r["event_id"])
        for r in await pool.fetch("SELECT consumer, event_id::text AS event_id FROM processed_events")
    }
    on_kafka: dict[str, Counter] = {}
    for topic in (ADAPTERS_REGISTERED.name, ADAPTERS_VALIDATED.name):
        records = await read_to_end(bootstrap, topic)
        on_kafka[topic] = Counter(json.loads(r.value)["event_id"] for r in records)
    lost = doubled = 0
    for adapter_id in sorted(world.accepted):
        for topic, counts in by_type.items():
            lost += _missing(counts[adapter_id] == 0, f"{adapter_id}: no {topic} outbox row")
        # a settled version emits one adapters.validated: a second means its effect applied twice (the
        # reconciler may ask for a slow version's check again, so adapters.registered may come twice)
        doubled += max(by_type["adapters.validated"][adapter_id] - 1, 0)
    for r in rows:
        lost += _missing(
            on_kafka[r["topic"]][r["id"]] == 0, f"{r['aggregate_id']}: {r['topic']} not on Kafka"
        )
        lost += _missing(
            (consumer_of[r["topic"]], r["id"]) not in applied, f"{r['aggregate_id']}: {r['topic']} unapplied"
        )
    return lost, doubled


def _missing(missing: bool, what: str) -> bool:
    if missing:
        print(f"LOST {what}")
    return missing


async def _outage(world: World, name: str, begin: Callable[[], object], end: Callable[[], object]) -> dict:
    tally, stop = Tally(), asyncio.Event()
    traffic = asyncio.create_task(_traffic(world, tally, stop))
    await asyncio.sleep(1.0)  # some traffic before the fault
    started = time.monotonic()
    await asyncio.to_thread(begin)
    await asyncio.sleep(FAULT_S)  # the fault's length is the experiment, not a wait for a condition
    await asyncio.to_thread(end)
    outage_s = time.monotonic() - started
    stop.set()
    await traffic
    healthy_s = await _time_to_healthy(world)
    await _resend_refused(world, tally)
    lost, doubled = await _lost_and_doubled(world)
    result = {
        "outage_s": round(outage_s, 1),
        "requests": dict(sorted(tally.codes.items())),
        "slowest_s": {k: round(v, 2) for k, v in tally.slowest.items()},
        "healthy_after_s": round(healthy_s, 1),
        "restarts": world.stack.restarts(),
        "events_lost": lost,
        "events_doubled": doubled,
    }
    world.results[name] = result
    print(f"\nOUTAGE {name}: {json.dumps(result)}")
    errors = [c for c in tally.codes if c.endswith(" 500") or c.endswith(" hung")]
    assert not errors, (
        result,
        ostack.tail(world.stack, "public-gateway", 80),
        ostack.tail(world.stack, "gateway", 80),
    )
    assert not tally.malformed, tally.malformed
    assert tally.slowest.get("known-key", 0) <= PUBLIC_DEADLINE_S, result
    assert tally.slowest.get("new-key", 0) <= PUBLIC_DEADLINE_S, result
    assert tally.slowest.get("registration", 0) <= INTERNAL_DEADLINE_S, result
    assert (lost, doubled) == (0, 0), result
    return result


@pytest.fixture(scope="module")
async def world(services):
    async with ostack.outage_stack(services.settings()) as stack:
        pool = await asyncpg.create_pool(stack.settings.database_url, min_size=1, max_size=2)
        await create_tenant(pool, TENANT, 100, 1_000_000)
        base_hash = served_base_hash(GatewaySettings())
        await insert_ready_adapters(pool, [ReadyAdapter("outage-v1", TENANT, base_hash)])
        await insert_alias(pool, ALIAS, TENANT, "outage-v1")
        known = (await create_key(pool, TENANT)).secret
        fresh = [(await create_key(pool, TENANT)).secret for _ in range(600)]
        w = World(stack, pool, known, fresh, base_hash)
        async with httpx.AsyncClient(timeout=10) as c:  # the known key and its listing, cached
            resp = await c.get(f"{stack.public_url}/v1/models", headers={"Authorization": f"Bearer {known}"})
            assert resp.status_code == 200 and resp.json()["data"][0]["id"] == ALIAS, resp.text
        try:
            yield w
        finally:
            await pool.close()


async def test_postgres_stopped_and_restarted(world: World) -> None:
    settings = world.stack.settings
    result = await _outage(
        world, "postgres-restart", lambda: postgres.down(settings), lambda: postgres.up(settings)
    )
    assert result["requests"].get("known-key 200", 0) > 0  # served from the caches during the outage
    assert result["requests"].get("new-key 503", 0) > 0 and result["requests"].get("registration 503", 0) > 0


async def test_postgres_crashed_and_restarted(world: World) -> None:
    """`pg_ctl stop -m immediate`: every backend killed mid-statement, crash recovery on the way back."""
    settings = world.stack.settings
    result = await _outage(
        world,
        "postgres-immediate",
        lambda: postgres.down(settings, mode="immediate"),
        lambda: postgres.up(settings),
    )
    assert result["requests"].get("known-key 200", 0) > 0
    assert result["requests"].get("new-key 503", 0) > 0 and result["requests"].get("registration 503", 0) > 0


async def test_kafka_killed_while_publishing_and_restarted(world: World) -> None:
    """SIGKILL of the broker while the relay publishes the registrations' events: no controlled shutdown,
    unflushed log segments; what was acknowledged is kept (acks=all), the rest is published again."""
    settings = world.stack.settings
    result = await _outage(
        world, "kafka-sigkill", lambda: ostack.kill_broker(settings), lambda: kafka.up(settings)
    )
    assert set(result["requests"]) <= {"known-key 200", "new-key 200", "registration 202"}, result


async def test_kafka_stopped_and_restarted(world: World) -> None:
    settings = world.stack.settings
    result = await _outage(world, "kafka-restart", lambda: kafka.down(settings), lambda: kafka.up(settings))
    # PostgreSQL is up: everything is served, and registrations wait in the outbox for the broker
    assert set(result["requests"]) <= {"known-key 200", "new-key 200", "registration 202"}, result


async def test_postgres_paused(world: World) -> None:
    settings = world.stack.settings
    result = await _outage(
        world,
        "postgres-sigstop",
        lambda: ostack.pause_postgres_tree(settings),
        lambda: ostack.resume_postgres_tree(settings),
    )
    assert result["requests"].get("known-key 200", 0) > 0
    assert result["requests"].get("new-key 503", 0) > 0


async def test_a_killed_process_is_restarted_and_counted(world: World) -> None:
    stack = world.stack
    before = stack.restarts()["relay"]
    pid = stack.app_pids()["relay"]
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    healthy_s = await _time_to_healthy(world)
    assert stack.app_pids()["relay"] != pid
    status = await asyncio.to_thread(ostack.status_json, stack)
    assert status["relay"]["restarts"] == before + 1 and status["relay"]["healthy"] is True, status
    assert status["supervisor"]["healthy"] is True, status
    print(f"\nKILLED relay: healthy again after {healthy_s:.1f}s, restarts {status['relay']['restarts']}")


async def _committed(settings, group: str, tp: TopicPartition) -> int:
    """The group's committed offset on tp (-1 when none)."""
    admin = make_admin(kafka.admin_settings(settings))
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group, partitions=[tp])
    finally:
        await admin.close()
    found = offsets.get(tp)
    return found.offset if found is not None else -1


def _partition_of(topic: str, key: str) -> TopicPartition:
    """The partition the producers' default partitioner gives key on topic."""
    parts = list(range(BY_NAME[topic].partitions))
    return TopicPartition(topic, DefaultPartitioner()(key.encode(), parts, parts))


async def _record_of(settings, topic: str, event_id: str) -> tuple[TopicPartition, int] | None:
    for r in await read_to_end(settings.kafka_bootstrap, topic):
        if json.loads(r.value)["event_id"] == event_id:
            return TopicPartition(topic, r.partition), r.offset
    return None


@pytest.mark.parametrize(
    ("app", "group"), [("registry-validator", "registry-validator"), ("placement-worker", "placement-worker")]
)
async def test_a_worker_killed_after_its_effect_before_its_commit_applies_it_once(
    world: World, app: str, group: str
) -> None:
    """The worker is SIGKILLed the moment its effect's transaction commits (a NOTIFY from a trigger on
    processed_events), before it commits the record's offset; a kill that came too late is tried again.
    The restarted worker reads the record again and commits past it. A second effect of the validator would
    be a second adapters.validated (_lost_and_doubled counts them); the placement worker's effect here is a
    replan of a fleet with no replicas, so for it the test shows the re-read, and apply_once's
    processed_events key is what keeps the effect single."""
    stack, pool = world.stack, world.pool
    await pool.execute(
        """CREATE OR REPLACE FUNCTION notify_applied() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN PERFORM pg_notify('applied', NEW.consumer || ' ' || NEW.event_id); RETURN NEW; END $$;
           DROP TRIGGER IF EXISTS notify_applied ON processed_events;
           CREATE TRIGGER notify_applied AFTER INSERT ON processed_events
               FOR EACH ROW EXECUTE FUNCTION notify_applied();"""
    )
    listener = await asyncpg.connect(stack.settings.database_url)
    service = {"Authorization": f"Bearer {ostack.SERVICE_TOKEN}"}
    caught = 0
    try:
        for _attempt in range(5):
            pid = stack.app_pids()[app]
            assert pid is not None
            applied: asyncio.Queue[str] = asyncio.Queue()

            def on_notify(
                _c: object, _pid: int, _channel: str, payload: str, pid: int = pid, applied=applied
            ) -> None:
                consumer, event_id = payload.split(" ", 1)
                if consumer == app:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                    applied.put_nowait(event_id)

            await listener.add_listener("applied", on_notify)
            body = _registration(world.base_hash)
            async with httpx.AsyncClient(timeout=HANG_S) as c:
                resp = await c.post(f"{stack.internal_url}/internal/adapters", json=body, headers=service)
            assert resp.status_code == 202, resp.text
            world.accepted.add(body["adapter_id"])
            event_id = await asyncio.wait_for(applied.get(), 60)
            await listener.remove_listener("applied", on_notify)
            # the first record it applied after this point: this registration's, or one still in flight;
            # its group's offset is read at once, before the supervisor restarts the worker
            row = await pool.fetchrow(
                "SELECT aggregate_type, aggregate_id FROM outbox WHERE id = $1::uuid", event_id
            )
            tp = _partition_of(row["aggregate_type"], row["aggregate_id"])
            committed = await _committed(stack.settings, group, tp)
            found = await _record_of(stack.settings, tp.topic, event_id)
            assert found is not None and found[0] == tp, f"{event_id} not on {tp}: {found}"
            offset = found[1]
            await _time_to_healthy(world)
            if committed <= offset:  # the effect was in PostgreSQL, the offset not on Kafka
                caught += 1
                # the restarted worker read the record again and committed past it
                assert await _committed(stack.settings, group, tp) > offset
                break
    finally:
        await listener.close()
        await pool.execute("DROP TRIGGER IF EXISTS notify_applied ON processed_events")
    assert caught, f"{app}: every kill landed after the offset commit"
    assert await _lost_and_doubled(world) == (0, 0)
    print(f"\nKILLED {app} between its effect and its commit: read again, restarts {stack.restarts()[app]}")
