"""The gateway's alias cache on the real PostgreSQL: the row decides, an aliases.changed event only makes
the next request read it again, and a read that overlapped an event is not kept."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest

from gateway.public.routing.alias_cache import AliasCache
from gateway.public.routing.rollout import AliasTarget
from gateway.registry.aliases import set_alias
from harness.seed import ReadyAdapter, insert_ready_adapters
from schemas.events import AliasChanged

pytestmark = pytest.mark.integration

HASH = "sha256:" + "a" * 64  # the adapters' base model hash: nothing here compares it

ALIAS = "acme/support:prod"
HOUR = 3600.0  # a TTL no test outlives: whatever changes an answer here is the event, not the clock


@pytest.fixture
async def versions(pool: asyncpg.Pool) -> asyncpg.Pool:
    await pool.execute("INSERT INTO tenants (tenant_id) VALUES ('acme')")
    await insert_ready_adapters(pool, [ReadyAdapter(f"acme-support-v{v}", "acme", HASH, v) for v in (1, 2)])
    return pool


def _changed(adapter_id: str, revision: int) -> AliasChanged:
    return AliasChanged(alias=ALIAS, tenant_id="acme", adapter_id=adapter_id, revision=revision)


async def test_an_event_makes_the_next_request_see_the_moved_alias(versions: asyncpg.Pool) -> None:
    cache = AliasCache(versions, ttl_s=HOUR)
    await set_alias(versions, ALIAS, "acme-support-v1")
    assert await cache.resolve("acme", ALIAS) == AliasTarget("acme-support-v1")
    view, _ = await set_alias(versions, ALIAS, "acme-support-v2")
    assert await cache.resolve("acme", ALIAS) == AliasTarget("acme-support-v1")  # cached: no event yet
    cache.apply(_changed(view.adapter_id, view.revision))
    assert await cache.resolve("acme", ALIAS) == AliasTarget("acme-support-v2")
    assert await cache.resolve("globex", ALIAS) is None  # another tenant's alias does not exist for them


async def test_an_event_the_row_does_not_bear_out_routes_nowhere_new(versions: asyncpg.Pool) -> None:
    """Another fleet on the same topic moves its own alias of the same name, to a higher revision."""
    cache = AliasCache(versions, ttl_s=HOUR)
    await set_alias(versions, ALIAS, "acme-support-v1")
    assert await cache.resolve("acme", ALIAS) == AliasTarget("acme-support-v1")
    cache.apply(_changed("acme-support-v2", 99))
    assert await cache.resolve("acme", ALIAS) == AliasTarget("acme-support-v1")
    view, _ = await set_alias(versions, ALIAS, "acme-support-v2")  # revision 2, below the foreign 99
    cache.apply(_changed(view.adapter_id, view.revision))
    assert await cache.resolve("acme", ALIAS) == AliasTarget("acme-support-v2")


class _GatedPool:
    """The real pool, with each fetchrow held at a gate until the test opens it: an interleaving, not a fake."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool, self.reading, self.gate = pool, asyncio.Event(), asyncio.Event()

    async def fetchrow(self, query: str, *args: Any) -> asyncpg.Record | None:
        self.reading.set()
        await self.gate.wait()
        return await self.pool.fetchrow(query, *args)


async def test_a_read_that_overlapped_an_event_is_answered_but_not_kept(versions: asyncpg.Pool) -> None:
    await set_alias(versions, ALIAS, "acme-support-v1")
    gated = _GatedPool(versions)
    cache = AliasCache(gated, ttl_s=HOUR)  # type: ignore[arg-type]
    read = asyncio.create_task(cache.resolve("acme", ALIAS))
    await gated.reading.wait()
    cache.apply(_changed("acme-support-v1", 1))  # any event for any alias while the read is under way
    gated.gate.set()
    assert await read == AliasTarget("acme-support-v1")
    await set_alias(versions, ALIAS, "acme-support-v2")  # no event for this move: only a fresh read sees it
    assert await cache.resolve("acme", ALIAS) == AliasTarget("acme-support-v2")
