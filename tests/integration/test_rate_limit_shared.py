"""Two real public gateways share each tenant's rate limit through a real Redis, and each falls back to
its share of the limit while Redis is stopped."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections import Counter

import asyncpg
import httpx
import pytest

from gateway.tenants import create_key, create_tenant
from harness.databases import throwaway_database
from harness.redis_server import RedisServer, redis_server
from harness.seed import ReadyAdapter, insert_alias, insert_ready_adapters
from lorafleet.db.migrate import migrate
from tests.integration.public_gateways import public_gateways

pytestmark = pytest.mark.integration

RPS = 2.0  # the tenant's requests/s; its burst is one second of it
BASE_HASH = "sha256:" + "0" * 64
PHASE_S = 6.0


async def _seed(database_url: str) -> str:
    await migrate(database_url)
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    try:
        await create_tenant(pool, "acme", RPS, 10_000_000)
        await insert_ready_adapters(pool, [ReadyAdapter("acme-v1", "acme", BASE_HASH)])
        await insert_alias(pool, "acme/support:prod", "acme", "acme-v1")
        return (await create_key(pool, "acme")).secret
    finally:
        await pool.close()


async def _hammer(urls: list[str], key: str, seconds: float) -> tuple[dict[str, Counter[int]], float]:
    """Send requests to every gateway in turn, 4 at a time, for `seconds`; status counts per gateway and
    the time from the first request sent to the last answer."""
    counts: dict[str, Counter[int]] = {u: Counter() for u in urls}
    body = {"model": "acme/support:prod", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    start = time.monotonic()

    async def worker(n: int) -> None:
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=30) as client:
            i = n
            while time.monotonic() - start < seconds:
                url = urls[i % len(urls)]
                i += 1
                resp = await client.post(f"{url}/v1/chat/completions", json=body)
                counts[url][resp.status_code] += 1

    await asyncio.gather(*(worker(n) for n in range(4)))
    return counts, time.monotonic() - start


def _admitted(counts: Counter[int]) -> int:
    # no replica runs here: an admitted request is answered 503 no_replica_available, a refused one 429
    return sum(n for status, n in counts.items() if status != 429)


async def _fallback_gauge(url: str) -> float:
    async with httpx.AsyncClient() as client:
        text = (await client.get(f"{url}/metrics", timeout=10)).text
    lines = [line for line in text.splitlines() if line.startswith("gateway_rate_limit_fallback ")]
    return float(lines[0].split()[1])


async def test_two_gateways_admit_the_limit_with_redis_and_their_shares_without(services, tmp_path) -> None:
    async with throwaway_database(services.database_url, f"rl_{uuid.uuid4().hex[:10]}") as database_url:
        key = await _seed(database_url)
        with redis_server(tmp_path / "redis") as redis:
            env = _env(services, database_url, redis)
            async with public_gateways(env, tmp_path, 2) as urls:
                counts, elapsed = await _hammer(urls, key, PHASE_S)
                _check_phase(counts, elapsed, "redis")
                assert [await _fallback_gauge(u) for u in urls] == [0.0, 0.0]

                redis.stop()
                counts, elapsed = await _hammer(urls, key, PHASE_S)
                _check_phase(counts, elapsed, "fallback")
                assert [await _fallback_gauge(u) for u in urls] == [1.0, 1.0]
                # each gateway admits on its own share: neither refuses everything nor fails
                assert all(_admitted(c) >= 2 for c in counts.values()), counts


def _check_phase(counts: dict[str, Counter[int]], elapsed: float, phase: str) -> None:
    statuses = set().union(*counts.values())
    assert statuses <= {429, 503}, (phase, counts)  # 503: admitted, no replica; never a 500
    total = sum(_admitted(c) for c in counts.values())
    sent = sum(sum(c.values()) for c in counts.values())
    # One bucket's worth: a one-second burst plus the refill over the phase. Each gateway counting the
    # whole limit alone would admit about twice this.
    ceiling = max(1.0, RPS) + RPS * elapsed
    assert sent > 3 * ceiling, (phase, sent, counts)  # the offered load is well over the limit
    assert 0.6 * RPS * elapsed <= total <= ceiling + 1, (phase, total, ceiling, counts)


def _env(services, database_url: str, redis: RedisServer) -> dict[str, str]:
    return {
        **os.environ,
        "LORAFLEET_KAFKA_BOOTSTRAP": services.kafka_bootstrap,
        "LORAFLEET_DATABASE_URL": database_url,
        "LORAFLEET_REDIS_URL": redis.url,
        "LORAFLEET_GATEWAY_PUBLIC_GATEWAYS": "2",
        "LORAFLEET_GATEWAY_KEY_CACHE_TTL_S": "30",
        # no replicas of this test's own, and never a `make up` fleet's on the same Kafka
        "LORAFLEET_GATEWAY_REPLICA_ID_PREFIX": f"rlt-{uuid.uuid4().hex[:6]}-",
        "OMP_NUM_THREADS": "1",
    }
