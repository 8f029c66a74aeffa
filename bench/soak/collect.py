"""The fault soak's end-of-run facts: registrations from the registry, usage events from the broker, and
what the replicas, the gateway and Redis still hold. Each wait has a deadline and says what it awaited."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable

import httpx
from aiokafka import TopicPartition

from bench.soak.facts import Facts, Registration, Release, UsageEvent
from bench.soak.invariants import absent
from bench.soak.stack import SoakStack
from harness.stacks.churn import RateLedger, gateway_metrics, replica_metrics
from lorafleet.kafka import make_consumer
from ops.stack import kafka
from schemas.topics import REQUESTS_COMPLETED

HELD_PREFIXES = ("lorafleet_replica_holds", "vllm:num_requests_running", "vllm:num_requests_waiting")
KV_USAGE = "vllm:kv_cache_usage_perc"
INFLIGHT = ("gateway_inflight_tokens{pool=default}", "gateway_inflight_requests")


async def poll(check: Callable[[], Awaitable[bool]], within_s: float, every_s: float = 0.5) -> bool:
    """check() until true or within_s passes; whether it held."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            if await check():
                return True
        except (OSError, httpx.HTTPError):
            pass  # a service still coming back
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(every_s)


async def _unsettled(stack: SoakStack, ids: list[str]) -> int:
    """Registrations still pending, or with an outbox event not yet applied by its consumer."""
    return int(
        await stack.pool.fetchval(
            """SELECT (SELECT count(*) FROM adapters
                     WHERE adapter_id = ANY($1::text[]) AND status = 'pending')
                    + (SELECT count(*) FROM outbox o
                       WHERE o.aggregate_id = ANY($1::text[])
                         AND o.aggregate_type IN ('adapters.registered', 'adapters.validated')
                         AND NOT EXISTS (
                           SELECT 1 FROM processed_events p WHERE p.event_id = o.id AND p.consumer =
                             CASE o.aggregate_type WHEN 'adapters.registered' THEN 'registry-validator'
                                                   ELSE 'placement-worker' END))""",
            ids,
        )
    )


async def registrations(stack: SoakStack, acked: dict[str, bool], within_s: float) -> list[Registration]:
    """Each registration's final state and adapters.validated rows, once nothing is left to settle (or
    within_s passed: what is left then shows as a violation)."""
    ids = sorted(acked)

    async def settled() -> bool:
        return await _unsettled(stack, ids) == 0

    await poll(settled, within_s)
    status = {
        r["adapter_id"]: r["status"]
        for r in await stack.pool.fetch(
            "SELECT adapter_id, status FROM adapters WHERE adapter_id = ANY($1::text[])", ids
        )
    }
    validated = {
        r["aggregate_id"]: r["n"]
        for r in await stack.pool.fetch(
            """SELECT aggregate_id, count(*) AS n FROM outbox
               WHERE aggregate_type = 'adapters.validated' AND aggregate_id = ANY($1::text[])
               GROUP BY aggregate_id""",
            ids,
        )
    }
    return [Registration(a, acked[a], status.get(a), int(validated.get(a, 0))) for a in ids]


async def read_usage(stack: SoakStack, timeout_s: float = 60.0) -> list[UsageEvent]:
    """Every requests.completed record on the private broker, from its start to its end as of now."""
    consumer = make_consumer(kafka.admin_settings(stack.settings), group_id=None)
    await consumer.start()
    out: list[UsageEvent] = []
    deadline = time.monotonic() + timeout_s
    try:
        parts = [TopicPartition(REQUESTS_COMPLETED.name, p) for p in range(REQUESTS_COMPLETED.partitions)]
        consumer.assign(parts)
        end = await consumer.end_offsets(parts)
        for tp, first in (await consumer.beginning_offsets(parts)).items():
            consumer.seek(tp, first)
        while [tp for tp in parts if await consumer.position(tp) < end[tp]]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{REQUESTS_COMPLETED.name} not read to its end within {timeout_s}s")
            batch = await consumer.getmany(*parts, timeout_ms=500, max_records=5000)
            for tp, records in batch.items():
                for r in records:
                    if r.offset < end[tp]:
                        body = json.loads(r.value)
                        out.append(UsageEvent(str(body["event_id"]), str(body["request_id"])))
    finally:
        await consumer.stop()
    return out


async def usage(stack: SoakStack, facts: Facts, within_s: float) -> list[UsageEvent]:
    """The usage events, once every streamed chat has one (the spools have drained) or within_s passed."""
    want = {c.request_id for c in facts.chats if c.status == 200 and c.request_id}
    got: list[UsageEvent] = []

    async def arrived() -> bool:
        nonlocal got
        got = await read_usage(stack)
        return want <= {e.request_id for e in got}

    await poll(arrived, within_s, every_s=2.0)
    return got


async def release(stack: SoakStack, ledger: RateLedger, within_s: float) -> Release:
    """What is held at the end, once nothing is (or within_s passed)."""
    snap: Release | None = None

    async def take() -> Release:
        holds, missing = {}, []
        for name, r in stack.replicas.items():
            m = await replica_metrics(r)
            holds[name] = {k: v for k, v in m.items() if k.startswith((*HELD_PREFIXES, KV_USAGE))}
            missing += [f"{name} {n}" for n in absent(m, (*HELD_PREFIXES, KV_USAGE))]
        g = await gateway_metrics(stack.infra.public_url)
        inflight = {k: g[k] for k in INFLIGHT if k in g}
        missing += [f"gateway {n}" for n in absent(g, INFLIGHT)]
        if ledger.stopped is not None:  # its counts stopped at some moment: no longer a ledger of the run
            missing.append(f"redis rate ledger ({ledger.stopped})")
            return Release(holds, inflight, {}, missing)
        ledgers = {t.tenant_id: ledger.by_tenant(t.tenant_id)[:2] for t in stack.tenants}
        return Release(holds, inflight, ledgers, missing)

    async def released() -> bool:
        nonlocal snap
        snap = await take()
        return (
            not snap.missing
            and not any(v for held in snap.replica_holds.values() for v in held.values())
            and not any(snap.gateway_inflight.values())
            and all(a == b for a, b in snap.ledger.values())
        )

    await poll(released, within_s)
    return snap if snap is not None else await take()
