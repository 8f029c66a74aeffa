"""The alias cache keeps each tenant's misses apart: endless unknown names from one tenant evict only that
tenant's own misses, and every other tenant's cached answers stay (the store-outage fallback serves them)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.errors import StoreUnavailable
from gateway.public import store_guard
from gateway.public.routing import alias_cache
from gateway.public.routing.alias_cache import AliasCache
from schemas.events import AliasChanged


class Store:
    """fetchrow over {(tenant, alias): adapter_id}; `down` makes every read fail as an outage does."""

    def __init__(self, rows: dict[tuple[str, str], str]) -> None:
        self.rows = rows
        self.reads = 0
        self.down = False

    async def fetch(self, sql: str, max_rows: int, timeout: float) -> list[dict[str, Any]]:
        """Every row, as refresh_all reads them."""
        self.reads += 1
        if self.down:
            raise OSError("connection refused")
        rows = [
            {"tenant_id": t, "alias": a, "adapter_id": v, "canary_adapter_id": None, "canary_weight": 0}
            for (t, a), v in self.rows.items()
        ]
        return rows[:max_rows]

    async def fetchrow(self, sql: str, alias: str, tenant_id: str) -> dict[str, Any] | None:
        self.reads += 1
        if self.down:
            raise OSError("connection refused")
        adapter = self.rows.get((tenant_id, alias))
        return (
            None
            if adapter is None
            else {"adapter_id": adapter, "canary_adapter_id": None, "canary_weight": 0}
        )


async def test_one_tenants_unknown_names_never_evict_another_tenants_entries() -> None:
    store = Store({("acme", "acme/support:prod"): "acme-support-v1"})
    cache = AliasCache(store, ttl_s=0.0, max_missing_per_tenant=50)  # type: ignore[arg-type]
    assert (await cache.resolve("acme", "acme/support:prod")).adapter_id == "acme-support-v1"  # type: ignore[union-attr]
    for i in range(5_000):
        assert await cache.resolve("evil", f"evil/n{i}:x") is None
    assert len(cache._missing["evil"]) == 50 and len(cache._entries) == 51
    store.down = True  # an outage: acme's expired entry still answers
    assert (await cache.resolve("acme", "acme/support:prod")).adapter_id == "acme-support-v1"  # type: ignore[union-attr]
    with pytest.raises(StoreUnavailable):
        await cache.resolve("evil", "evil/n0:x")  # long evicted: nothing to answer from


async def test_a_cached_miss_is_read_again_once_the_alias_exists() -> None:
    store = Store({})
    cache = AliasCache(store, ttl_s=60.0, max_missing_per_tenant=10)  # type: ignore[arg-type]
    assert await cache.resolve("acme", "acme/new:prod") is None
    assert await cache.resolve("acme", "acme/new:prod") is None and store.reads == 1  # the miss is cached
    store.rows[("acme", "acme/new:prod")] = "acme-new-v1"
    cache.apply(AliasChanged(tenant_id="acme", alias="acme/new:prod", adapter_id="acme-new-v1", revision=1))
    assert (await cache.resolve("acme", "acme/new:prod")).adapter_id == "acme-new-v1"  # type: ignore[union-attr]
    assert "acme/new:prod" not in cache._missing["acme"]


async def test_a_move_whose_event_never_arrives_is_served_once_the_ttl_passes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The reconciliation of an alias move: the row decides, the event only hurries it. A lost
    aliases.changed leaves the old target for at most the TTL, then the next request reads the move."""
    now = [1000.0]
    monkeypatch.setattr(alias_cache.time, "monotonic", lambda: now[0])
    store = Store({("acme", "acme/support:prod"): "acme-support-v1"})
    cache = AliasCache(store, ttl_s=10.0, max_missing_per_tenant=10)  # type: ignore[arg-type]
    assert (await cache.resolve("acme", "acme/support:prod")).adapter_id == "acme-support-v1"  # type: ignore[union-attr]
    store.rows[("acme", "acme/support:prod")] = "acme-support-v2"  # moved; its event is lost
    now[0] += 9.9
    assert (await cache.resolve("acme", "acme/support:prod")).adapter_id == "acme-support-v1"  # type: ignore[union-attr]
    now[0] += 0.2
    assert (await cache.resolve("acme", "acme/support:prod")).adapter_id == "acme-support-v2"  # type: ignore[union-attr]


async def test_each_lookup_is_counted_as_a_hit_a_miss_or_a_stale_answer() -> None:
    store = Store({("acme", "acme/support:prod"): "acme-support-v1"})
    outcomes: list[str] = []
    cache = AliasCache(store, ttl_s=60.0, counted=outcomes.append)  # type: ignore[arg-type]
    await cache.resolve("acme", "acme/support:prod")
    await cache.resolve("acme", "acme/support:prod")
    await cache.resolve("acme", "acme/unknown:prod")
    await cache.resolve("acme", "not an alias")  # outside the grammar: never looked up, never counted
    cache.ttl_s = 0.0
    cache.apply(
        AliasChanged(tenant_id="acme", alias="acme/support:prod", adapter_id="acme-support-v1", revision=2)
    )
    await cache.resolve("acme", "acme/support:prod")  # read again, now cached already expired
    store.down = True
    await cache.resolve("acme", "acme/support:prod")
    assert outcomes == ["miss", "hit", "miss", "miss", "stale"]
    assert store.reads == 4


async def test_after_a_bulk_read_a_first_request_for_any_alias_reads_nothing() -> None:
    """Thousands of tenants each ask for their alias now and then: read one at a time, most requests would
    wait on PostgreSQL. refresh_all reads them all in one statement."""
    store = Store({(f"t{i}", f"t{i}/bot:prod"): f"t{i}-v1" for i in range(300)})
    outcomes: list[str] = []
    cache = AliasCache(store, ttl_s=10.0, counted=outcomes.append)  # type: ignore[arg-type]
    assert await cache.refresh_all(max_rows=1_000, timeout_s=1.0) == 300
    for i in range(300):
        assert (await cache.resolve(f"t{i}", f"t{i}/bot:prod")).adapter_id == f"t{i}-v1"  # type: ignore[union-attr]
    assert await cache.resolve("t0", "t1/bot:prod") is None  # another tenant's alias: not found
    assert store.reads == 2 and outcomes == ["hit"] * 300 + ["miss"]


async def test_a_bulk_read_drops_a_cached_miss_and_keeps_a_move_made_while_it_ran() -> None:
    store = Store({("acme", "acme/a:prod"): "acme-a-v1", ("acme", "acme/b:prod"): "acme-b-v1"})
    cache = AliasCache(store, ttl_s=60.0)  # type: ignore[arg-type]
    assert await cache.resolve("acme", "acme/c:prod") is None  # a miss, cached
    store.rows[("acme", "acme/c:prod")] = "acme-c-v1"

    async def moved_meanwhile() -> None:  # the statement saw v1; the move and its event come before it ends
        store.rows[("acme", "acme/a:prod")] = "acme-a-v2"
        cache.apply(AliasChanged(tenant_id="acme", alias="acme/a:prod", adapter_id="acme-a-v2", revision=2))

    rows_then = dict(store.rows)
    rows_then[("acme", "acme/a:prod")] = "acme-a-v1"

    async def fetch_then(sql: str, max_rows: int, timeout: float) -> list[dict[str, Any]]:
        await moved_meanwhile()
        return [
            {"tenant_id": t, "alias": a, "adapter_id": v, "canary_adapter_id": None, "canary_weight": 0}
            for (t, a), v in rows_then.items()
        ]

    store.fetch = fetch_then  # type: ignore[method-assign]
    await cache.refresh_all(max_rows=1_000, timeout_s=1.0)
    reads = store.reads
    assert (await cache.resolve("acme", "acme/c:prod")).adapter_id == "acme-c-v1"  # type: ignore[union-attr]
    assert (await cache.resolve("acme", "acme/b:prod")).adapter_id == "acme-b-v1"  # type: ignore[union-attr]
    assert store.reads == reads  # both from the bulk read
    assert (await cache.resolve("acme", "acme/a:prod")).adapter_id == "acme-a-v2"  # type: ignore[union-attr]
    assert store.reads == reads + 1  # not the bulk read's v1: read again


async def test_a_lost_move_is_read_by_the_next_bulk_read_and_entries_never_lapse(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [1000.0]
    monkeypatch.setattr(alias_cache.time, "monotonic", lambda: now[0])
    store = Store({("acme", "acme/support:prod"): "acme-support-v1"})
    cache = AliasCache(store, ttl_s=10.0)  # type: ignore[arg-type]
    await cache.refresh_all(max_rows=10, timeout_s=1.0)
    store.rows[("acme", "acme/support:prod")] = "acme-support-v2"  # moved; its event is lost
    for _ in range(4):  # a bulk read every 5 s, half the TTL
        now[0] += 5.0
        await cache.refresh_all(max_rows=10, timeout_s=1.0)
        reads = store.reads
        assert (await cache.resolve("acme", "acme/support:prod")).adapter_id == "acme-support-v2"  # type: ignore[union-attr]
        assert store.reads == reads


async def test_a_failed_bulk_read_is_counted_and_leaves_the_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store({("acme", "acme/support:prod"): "acme-support-v1"})
    cache = AliasCache(store, ttl_s=10.0)  # type: ignore[arg-type]
    await cache.refresh_all(max_rows=10, timeout_s=1.0)
    store.down = True
    refreshed: list[str] = []

    async def once(_s: float) -> None:
        raise asyncio.CancelledError

    monkeypatch.setattr(store_guard.asyncio, "sleep", once)
    with pytest.raises(asyncio.CancelledError):
        await store_guard.keep_fresh(
            "aliases", 5.0, lambda: cache.refresh_all(max_rows=10, timeout_s=1.0), refreshed.append
        )
    assert refreshed == ["failed"]
    assert (await cache.resolve("acme", "acme/support:prod")).adapter_id == "acme-support-v1"  # type: ignore[union-attr]
