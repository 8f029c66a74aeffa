"""The object store fails while requests wait for one adapter's load (the real S3 behind a fault proxy).

Every waiting request gets 503 `adapter_loading_failed` with Retry-After; another tenant's adapter, already
in a slot, keeps being served meanwhile; the failure is remembered only for the cache's short TTL (no
second fetch within it), and the first request after it, with the store back, loads the adapter.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

from canary.churn import ChurnConfig, churn_requests, churn_settings
from canary.manifest import CanaryManifest
from canary.markers import markers_in_tokens
from lorafleet.fetch_retry import FetchPolicy
from replica.adapter_cache.errors import AdapterCacheError
from replica.adapter_cache.local_source import FirstFound
from replica.runtime import build_replica
from replica.server import create_app
from schemas.api import ADAPTER_WEIGHTS_NAME
from tests.canary.canary_util import train_tiny_canaries
from tests.gateway.adapter_files import make_peft_adapter
from tests.integration.s3_adapters import Records, cache_over, proxied_store, upload
from tests.replica.generate_util import generate

pytestmark = pytest.mark.integration

WAITERS = 6
TTL_S = 30.0  # on the test's own clock: it moves only when the test says


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def _until(pred, timeout: float = 60.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def test_requests_waiting_on_a_load_the_store_fails_get_503_and_the_next_after_recovery_loads(
    services, tmp_path: Path
) -> None:
    peft = make_peft_adapter(tmp_path / "peft", r=4, alpha=8.0)
    other = make_peft_adapter(tmp_path / "other", r=2, alpha=4.0)  # other bytes: a digest of its own
    policy = FetchPolicy(deadline_s=60.0, attempts=3, initial_s=0.05, max_s=0.2)
    async with proxied_store(services.settings(), read_timeout_s=1.0) as store:
        records = Records()
        cold = await upload(store.direct, peft, "acme-cold", records)
        hot = await upload(store.direct, other, "globex-hot", records)
        clock = Clock()
        cache = cache_over(store, records, tmp_path / "cache", policy)
        cache.failure_ttl_s, cache.clock = TTL_S, clock
        cache.release(await cache.acquire(hot.adapter_id, "globex"))  # the other tenant's, in a slot

        cold_key = cold.weights_uri.rsplit("/", 1)[-1]
        store.proxy.stall(512, match=cold_key)  # the load hangs mid-body...
        waiters = [asyncio.ensure_future(cache.acquire(cold.adapter_id, "acme")) for _ in range(WAITERS)]
        await _until(lambda: len(store.proxy.gets(f"{cold_key}/{ADAPTER_WEIGHTS_NAME}")) >= 1)
        assert not any(w.done() for w in waiters)
        store.proxy.fail(10_000, match=cold_key)  # ...and the store keeps failing for that prefix

        served = 0
        while not all(w.done() for w in waiters):  # the other tenant is served all through the outage
            lease = await asyncio.wait_for(cache.acquire(hot.adapter_id, "globex"), 30)
            cache.release(lease)
            served += 1
            await asyncio.sleep(0.05)
        assert served > 0
        results = await asyncio.gather(*waiters, return_exceptions=True)
        for got in results:
            assert isinstance(got, AdapterCacheError), got
            assert got.code == "adapter_loading_failed" and got.status == 503
            assert got.headers() == {"Retry-After": str(int(TTL_S))}
        assert cache.tier_of(cold.adapter_id) == "remote" and cache.cold_loads.loading() == {}

        # within the TTL: refused from memory, with the time left, and the store is not asked again
        store.proxy.heal()
        asked = len(store.proxy.gets(cold_key))
        clock.now += TTL_S / 2
        with pytest.raises(AdapterCacheError) as again:
            await cache.acquire(cold.adapter_id, "acme")
        assert again.value.code == "adapter_loading_failed"
        assert again.value.headers() == {"Retry-After": str(int(TTL_S / 2))}
        assert len(store.proxy.gets(cold_key)) == asked

        # past the TTL, with the store back: the next request loads it
        clock.now += TTL_S
        lease = await asyncio.wait_for(cache.acquire(cold.adapter_id, "acme"), 60)
        assert cache.tier_of(cold.adapter_id) == "gpu"
        cache.release(lease)


@pytest.fixture(scope="module")
def canaries(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, CanaryManifest]:
    return train_tiny_canaries(tmp_path_factory.mktemp("canaries"), 3)


async def test_through_the_replica_app_only_the_failing_adapters_requests_fail_and_others_run_on(
    services, canaries: tuple[Path, Path, CanaryManifest], tmp_path: Path
) -> None:
    """The replica's app, one canary served from its folder (the other tenant's) and one only in the real
    S3 behind the proxy: the store fails mid-download while 4 requests wait for it. They get HTTP 503
    adapter_loading_failed with Retry-After; the other tenant's requests run through the engine all along
    with their own marker and /health stays ok; after the TTL the next request loads it and is answered
    with its marker."""
    base, out, manifest = canaries
    hot, cold = manifest.adapters[0], manifest.adapters[1]
    markers = manifest.markers()
    settings = churn_settings(
        base, out, manifest, ChurnConfig(requests=0, slots_per_bucket=4), tmp_path
    ).model_copy(update={"adapter_dirs": {hot.adapter_id: out / hot.path}, "adapter_failure_ttl_s": TTL_S})
    prompts = [
        r.prompt_token_ids
        for r in churn_requests(ChurnConfig(requests=64, base_fraction=0.0), [hot.adapter_id])
    ]
    replica = build_replica(settings)
    app = create_app(replica)
    url = f"/internal/replicas/{settings.replica_id}/generate"
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)  # a failure is a 500, as served
    headers = {"Authorization": f"Bearer {settings.service_token}"}
    client = httpx.AsyncClient(transport=transport, base_url="http://replica", headers=headers, timeout=300)
    policy = FetchPolicy(deadline_s=60.0, attempts=3, initial_s=0.05, max_s=0.2)
    async with proxied_store(services.settings()) as store, app.router.lifespan_context(app), client:
        cache = replica.cache
        assert cache is not None
        records = Records()
        record = await upload(
            store.direct,
            out / cold.path,
            cold.adapter_id,
            records,
            manifest.base_model_hash,
            tuple(manifest.target_modules),
        )
        # the registry's answer and the store's address: what a replica gets from the gateway and its config
        cache.registry = FirstFound([cache.registry, records])
        cache.store.s3, cache.store.policy = store.s3, policy
        clock = Clock()
        cache.clock = clock

        def own_marker(adapter_id: str, tokens: object) -> bool:
            return isinstance(tokens, list) and set(markers_in_tokens(tokens, markers)) == {adapter_id}

        status, _, tokens = await generate(client, url, hot.adapter_id, "globex", prompts[0])
        assert status == 200 and own_marker(hot.adapter_id, tokens)

        key = record.weights_uri.rsplit("/", 1)[-1]
        store.proxy.stall(512, match=key)
        waiters = [
            asyncio.ensure_future(generate(client, url, cold.adapter_id, "acme", prompts[1 + i]))
            for i in range(4)
        ]
        await _until(lambda: len(store.proxy.gets(f"{key}/{ADAPTER_WEIGHTS_NAME}")) >= 1)
        store.proxy.fail(10_000, match=key)
        served = 0
        while not all(w.done() for w in waiters):
            status, _, tokens = await generate(
                client, url, hot.adapter_id, "globex", prompts[10 + served % 40]
            )
            assert status == 200 and own_marker(hot.adapter_id, tokens), (status, tokens)
            served += 1
        assert served > 0 and (await client.get("/health")).json() == {"status": "ok"}
        for status, got_headers, error in [w.result() for w in waiters]:
            assert status == 503 and got_headers["retry-after"] == str(int(TTL_S)), (status, error)
            assert isinstance(error, dict) and error["error"]["code"] == "adapter_loading_failed"

        store.proxy.heal()
        asked = len(store.proxy.gets(key))
        clock.now += TTL_S / 2
        status, got_headers, error = await generate(client, url, cold.adapter_id, "acme", prompts[5])
        assert status == 503 and got_headers["retry-after"] == str(int(TTL_S / 2)), error
        assert len(store.proxy.gets(key)) == asked  # answered from memory: the store was not asked

        clock.now += TTL_S
        status, _, tokens = await generate(client, url, cold.adapter_id, "acme", prompts[6])
        assert status == 200 and own_marker(cold.adapter_id, tokens), (status, tokens)
