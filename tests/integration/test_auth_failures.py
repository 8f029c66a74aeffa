"""Failed authentications are limited per source address across two real public gateways sharing a real
Redis, each falls back to its share while Redis is stopped (when an Idempotency-Key gets 503), and an API key
in the query string is never accepted.

Each client binds its own loopback address (127.0.0.x), so the gateways see distinct sources.
"""

from __future__ import annotations

import os
import uuid

import asyncpg
import httpx
import pytest

from gateway.tenants import create_key, create_tenant
from harness.databases import throwaway_database
from harness.redis_server import redis_server
from lorafleet.db.migrate import migrate
from tests.integration.openai_errors import openai_error
from tests.integration.public_gateways import public_gateways

pytestmark = pytest.mark.integration

LIMIT = 5
WINDOW_S = 120


async def _seed(database_url: str) -> str:
    await migrate(database_url)
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    try:
        await create_tenant(pool, "acme", 1000, 10_000_000)
        return (await create_key(pool, "acme")).secret
    finally:
        await pool.close()


def _client(source: str) -> httpx.AsyncClient:
    """A client whose connections come from the loopback address `source`."""
    return httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(local_address=source), timeout=30)


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_auth_failures_are_limited_per_source_across_gateways_and_locally_without_redis(
    services, tmp_path
) -> None:
    async with throwaway_database(services.database_url, f"af_{uuid.uuid4().hex[:10]}") as database_url:
        key = await _seed(database_url)
        with redis_server(tmp_path / "redis") as redis:
            env = _env(services, database_url, redis.url)
            async with public_gateways(env, tmp_path, 2) as urls:
                async with _client("127.0.0.2") as attacker, _client("127.0.0.3") as bystander:
                    # LIMIT failures spread over both gateways: the next try on either is refused.
                    for i in range(LIMIT):
                        bad = await attacker.get(f"{urls[i % 2]}/v1/models", headers=_bearer(f"sk-bad-{i}"))
                        assert bad.status_code == 401, (i, bad.text)
                    for url in urls:
                        refused = await attacker.get(f"{url}/v1/models", headers=_bearer("sk-bad-again"))
                        _assert_auth_limited(refused)
                        # refused before the key is looked at: a valid key this gateway has not yet seen
                        # work, from that address, too
                        _assert_auth_limited(await attacker.get(f"{url}/v1/models", headers=_bearer(key)))
                        # another address is unaffected: its valid key works, its bad key is a 401
                        ok = await bystander.get(f"{url}/v1/models", headers=_bearer(key))
                        assert ok.status_code == 200, ok.text
                        other_bad = await bystander.get(f"{url}/v1/models", headers=_bearer("sk-bad-b"))
                        assert other_bad.status_code == 401, other_bad.text
                        # a tenant behind the locked address whose key has worked here is served: the bad
                        # client beside it locks out only keys the gateway has not seen work
                        vouched = await attacker.get(f"{url}/v1/models", headers=_bearer(key))
                        assert vouched.status_code == 200, vouched.text
                        _assert_auth_limited(await attacker.get(f"{url}/v1/models", headers=_bearer("sk-x")))
                    metrics = (await bystander.get(f"{urls[0]}/metrics")).text
                    assert "gateway_auth_refused_total 3.0" in metrics, metrics

                    # Redis stopped: each gateway counts alone, at ceil(LIMIT / 2) failures per source.
                    redis.stop()
                    # (and an Idempotency-Key cannot be honoured without the shared store: 503, not a run)
                    chat = {"model": "acme/x:prod", "messages": [{"role": "user", "content": "hi"}]}
                    keyed = {**_bearer(key), "Idempotency-Key": "k-1"}
                    down = await bystander.post(f"{urls[0]}/v1/chat/completions", json=chat, headers=keyed)
                    assert down.status_code == 503, down.text
                    assert openai_error(down)["code"] == "idempotency_unavailable"
                    assert int(down.headers["retry-after"]) >= 1
                    async with _client("127.0.0.4") as third:
                        share = -(-LIMIT // 2)
                        for i in range(share):
                            bad = await third.get(f"{urls[0]}/v1/models", headers=_bearer(f"sk-bad-{i}"))
                            assert bad.status_code == 401, (i, bad.text)
                        _assert_auth_limited(
                            await third.get(f"{urls[0]}/v1/models", headers=_bearer("sk-bad-more"))
                        )
                        # the other gateway has seen none of them: it still authenticates that address
                        other = await third.get(f"{urls[1]}/v1/models", headers=_bearer("sk-bad-elsewhere"))
                        assert other.status_code == 401, other.text


def _assert_auth_limited(resp: httpx.Response) -> None:
    assert resp.status_code == 429, resp.text
    assert openai_error(resp)["code"] == "too_many_auth_failures"
    assert 1 <= int(resp.headers["retry-after"]) <= WINDOW_S


async def test_an_api_key_in_the_query_string_is_refused_like_any_bad_key_and_never_logged(
    services, tmp_path
) -> None:
    async with throwaway_database(services.database_url, f"aq_{uuid.uuid4().hex[:10]}") as database_url:
        key = await _seed(database_url)
        env = {
            **_env(services, database_url, "redis://127.0.0.1:1/0"),
            "LORAFLEET_GATEWAY_RATE_LIMIT_STORE": "local",
            "LORAFLEET_GATEWAY_AUTH_FAILURE_LIMIT": "100",
        }
        async with public_gateways(env, tmp_path, 1) as (url,), _client("127.0.0.5") as c:
            missing = await c.get(f"{url}/v1/models")
            assert missing.status_code == 401
            chat = {"model": "acme/x:prod", "messages": [{"role": "user", "content": "hi"}]}
            tries = [
                await c.get(f"{url}/v1/models?api_key={key}"),
                await c.get(f"{url}/v1/models?key={key}"),
                await c.post(f"{url}/v1/chat/completions?api_key={key}", json=chat),
                await c.post(f"{url}/v1/chat/completions?key={key}", json=chat),
            ]
            for resp in tries:
                assert resp.status_code == 401, resp.text
                assert resp.json() == missing.json()
                assert resp.json()["error"]["code"] == "invalid_api_key"
                assert key not in resp.text
            assert (await c.get(f"{url}/v1/models", headers=_bearer(key))).status_code == 200
        logged = (tmp_path / "gateway-0.log").read_text(errors="replace")
        assert key not in logged and key[-12:] not in logged


def _env(services, database_url: str, redis_url: str) -> dict[str, str]:
    return {
        **os.environ,
        "LORAFLEET_KAFKA_BOOTSTRAP": services.kafka_bootstrap,
        "LORAFLEET_DATABASE_URL": database_url,
        "LORAFLEET_REDIS_URL": redis_url,
        "LORAFLEET_GATEWAY_PUBLIC_GATEWAYS": "2",
        "LORAFLEET_GATEWAY_AUTH_FAILURE_LIMIT": str(LIMIT),
        "LORAFLEET_GATEWAY_AUTH_FAILURE_WINDOW_S": str(WINDOW_S),
        "LORAFLEET_GATEWAY_KEY_CACHE_TTL_S": "30",
        # no replicas of this test's own, and never a `make up` fleet's on the same Kafka
        "LORAFLEET_GATEWAY_REPLICA_ID_PREFIX": f"aft-{uuid.uuid4().hex[:6]}-",
        "OMP_NUM_THREADS": "1",
    }
