"""Alias -> adapter id for the caller's tenant, cached; aliases.changed updates the cache at once.

Only the caller's own tenant's aliases resolve: another tenant's alias is indistinguishable from one that
does not exist. The TTL is a backstop for a missed event; an event newer than the cached revision wins.
"""

from __future__ import annotations

import asyncio
import logging
import time

import asyncpg

from lorafleet.config import PlatformSettings
from lorafleet.kafka import make_consumer
from schemas import topics
from schemas.events import AliasChanged, EventValidationError, parse_event

log = logging.getLogger(__name__)


class AliasCache:
    """(tenant, alias) -> (expires, revision, adapter_id | None)."""

    def __init__(self, pool: asyncpg.Pool, ttl_s: float = 10.0, max_entries: int = 100_000) -> None:
        self.pool = pool
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._entries: dict[tuple[str, str], tuple[float, int, str | None]] = {}

    async def resolve(self, tenant_id: str, alias: str) -> str | None:
        """The adapter id the alias points at now, if the alias exists and belongs to tenant_id."""
        key = (tenant_id, alias)
        now = time.monotonic()
        hit = self._entries.get(key)
        if hit is not None and hit[0] > now:
            return hit[2]
        row = await self.pool.fetchrow(
            "SELECT adapter_id, revision FROM aliases WHERE alias = $1 AND tenant_id = $2", alias, tenant_id
        )
        current = self._entries.get(key)
        if current is not None and row is not None and current[1] > row["revision"]:
            return current[2]  # an event already told us something newer than this read
        if len(self._entries) >= self.max_entries:
            self._entries.clear()
        value = (row["adapter_id"], row["revision"]) if row is not None else (None, 0)
        self._entries[key] = (now + self.ttl_s, value[1], value[0])
        return value[0]

    def apply(self, event: AliasChanged) -> None:
        """An alias moved: cache the new target unless we already hold a newer revision."""
        key = (event.tenant_id, event.alias)
        current = self._entries.get(key)
        if current is not None and current[1] >= event.revision:
            return
        self._entries[key] = (time.monotonic() + self.ttl_s, event.revision, event.adapter_id)

    async def list_aliases(self, tenant_id: str) -> list[tuple[str, float]]:
        """(alias, updated_at unix) of the tenant's aliases."""
        rows = await self.pool.fetch(
            "SELECT alias, updated_at FROM aliases WHERE tenant_id = $1 ORDER BY alias", tenant_id
        )
        return [(r["alias"], r["updated_at"].timestamp()) for r in rows]


async def consume_alias_changes(platform: PlatformSettings, cache: AliasCache, ready: asyncio.Event) -> None:
    """Follow aliases.changed from its end (older moves are already in the database)."""
    consumer = make_consumer(platform, topics.ALIASES_CHANGED.name, group_id=None, auto_offset_reset="latest")
    await consumer.start()
    try:
        ready.set()
        async for msg in consumer:
            try:
                event = parse_event(msg.value, topics.ALIASES_CHANGED.name)
            except EventValidationError as exc:
                log.warning("ignoring a bad aliases.changed message: %s", exc)
                continue
            assert isinstance(event, AliasChanged)
            cache.apply(event)
            log.info("alias %s -> %s (revision %d)", event.alias, event.adapter_id, event.revision)
    finally:
        await consumer.stop()
