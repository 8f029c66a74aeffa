"""Alias -> adapter id for the caller's tenant, cached; aliases.changed makes the next request read it again.

Only the caller's own tenant's aliases resolve: another tenant's alias is indistinguishable from one that
does not exist. The database decides where an alias points, never the event: an event only drops the cached
entry. So an event for the same alias name from another fleet on the same Kafka cluster, or a replayed
one, costs one read and cannot route a request anywhere the row does not say. The TTL is a backstop for a
missed event. While the store is unavailable an expired entry keeps answering; an alias never read gets
StoreUnavailable, a 503.

refresh_all(), which the app runs each period (store_guard.keep_fresh, under the TTL), reads every alias in
one statement. So requests find their alias cached, a first one included, and none waits on a read while
the store is healthy. A fleet of thousands of tenants asks for most of its aliases only now and then: read
one at a time, most requests would miss.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable

import asyncpg

from gateway.errors import StoreUnavailable
from gateway.public.routing.rollout import AliasTarget
from gateway.public.store_guard import StoreGuard
from lorafleet.config import PlatformSettings
from lorafleet.dead_letters import DeadLetters
from lorafleet.kafka import make_consumer
from schemas import topics
from schemas.events import AliasChanged
from schemas.ids import ALIAS_RE

log = logging.getLogger(__name__)


class AliasCache:
    """(tenant, alias) -> (expires, target | None), read from the aliases table.

    Aliases that exist are bounded by the table. Names that do not (negative entries) are kept per tenant,
    at most max_missing_per_tenant each, the oldest dropped first: a tenant asking for endless unknown names
    only ever evicts its own misses, never another tenant's entries (which the store-outage fallback
    answers from)."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        ttl_s: float = 10.0,
        max_missing_per_tenant: int = 1_000,
        guard: StoreGuard | None = None,
        counted: Callable[[str], None] = lambda outcome: None,
    ) -> None:
        self.pool = pool
        self.counted = counted  # each lookup's outcome: hit, miss (read from the store) or stale
        self.guard = guard or StoreGuard(deadline_s=2.0, pause_s=1.0)
        self.ttl_s = ttl_s
        self.max_missing_per_tenant = max_missing_per_tenant
        self._entries: dict[tuple[str, str], tuple[float, AliasTarget | None]] = {}
        self._missing: dict[str, OrderedDict[str, None]] = {}  # tenant -> its cached misses, oldest first
        self._changes = 0  # events applied so far
        self._listed: dict[str, list[tuple[str, float]]] = {}  # tenant -> its last alias listing
        self._moved: set[tuple[str, str]] | None = None  # aliases moved during a bulk read, while one runs

    async def resolve(self, tenant_id: str, alias: str) -> AliasTarget | None:
        """Where the alias points now (its version and canary), if it exists and belongs to tenant_id. A name
        outside the alias grammar exists nowhere: it is never looked up (nor cached)."""
        if not ALIAS_RE.fullmatch(alias):
            return None
        key = (tenant_id, alias)
        hit = self._entries.get(key)
        if hit is not None and hit[0] > time.monotonic():
            self.counted("hit")
            return hit[1]
        changes = self._changes
        try:
            row = await self.guard.read(
                lambda: self.pool.fetchrow(
                    """SELECT adapter_id, canary_adapter_id, canary_weight FROM aliases
                       WHERE alias = $1 AND tenant_id = $2""",
                    alias,
                    tenant_id,
                )
            )
        except StoreUnavailable:
            if hit is None:
                raise
            self.counted("stale")
            return hit[1]  # the store is down: the last answer stands until it is back
        self.counted("miss")
        target = None
        if row is not None:
            target = AliasTarget(row["adapter_id"], row["canary_adapter_id"], row["canary_weight"] or 0.0)
        if changes == self._changes:  # an event during the read: the row may predate it, answer uncached
            self._store(key, target)
        return target

    def _store(self, key: tuple[str, str], target: AliasTarget | None) -> None:
        tenant_id, alias = key
        missing = self._missing.setdefault(tenant_id, OrderedDict())
        if target is None:
            missing[alias] = None
            missing.move_to_end(alias)
            while len(missing) > self.max_missing_per_tenant:
                oldest, _ = missing.popitem(last=False)
                self._entries.pop((tenant_id, oldest), None)
        else:
            missing.pop(alias, None)
        self._entries[key] = (time.monotonic() + self.ttl_s, target)

    def apply(self, event: AliasChanged) -> None:
        """An alias moved (here or in a fleet sharing the topic): read it again on its next request."""
        self._changes += 1
        key = (event.tenant_id, event.alias)
        self._entries.pop(key, None)
        if self._moved is not None:
            self._moved.add(key)
        missing = self._missing.get(event.tenant_id)
        if missing is not None:
            missing.pop(event.alias, None)

    async def refresh_all(self, max_rows: int, timeout_s: float) -> int:
        """Read every alias (the most recently moved max_rows, if there are more) into the cache in one
        statement; how many. An alias moved while the statement ran is left to its next request: the row read
        may predate the move."""
        moved: set[tuple[str, str]] = set()
        self._moved = moved
        try:
            rows = await self.pool.fetch(
                """SELECT tenant_id, alias, adapter_id, canary_adapter_id, canary_weight FROM aliases
                   ORDER BY updated_at DESC LIMIT $1""",
                max_rows,
                timeout=timeout_s,
            )
        finally:
            self._moved = None
        expires = time.monotonic() + self.ttl_s
        for row in rows:
            key = (row["tenant_id"], row["alias"])
            if key in moved or not ALIAS_RE.fullmatch(key[1]):
                continue
            target = AliasTarget(row["adapter_id"], row["canary_adapter_id"], row["canary_weight"] or 0.0)
            missing = self._missing.get(key[0])
            if missing is not None:
                missing.pop(key[1], None)
            self._entries[key] = (expires, target)
        if len(rows) >= max_rows:
            log.warning("more than %d aliases: the rest are read as requests name them", max_rows)
        return len(rows)

    async def list_aliases(self, tenant_id: str) -> list[tuple[str, float]]:
        """(alias, updated_at unix) of the tenant's aliases; the last listing while the store is down."""
        try:
            rows = await self.guard.read(
                lambda: self.pool.fetch(
                    "SELECT alias, updated_at FROM aliases WHERE tenant_id = $1 ORDER BY alias", tenant_id
                )
            )
        except StoreUnavailable:
            if tenant_id not in self._listed:
                raise
            return self._listed[tenant_id]
        listed = [(r["alias"], r["updated_at"].timestamp()) for r in rows]
        self._listed[tenant_id] = listed  # one per tenant that authenticated: bounded by the tenants table
        return listed


async def consume_alias_changes(
    platform: PlatformSettings, cache: AliasCache, ready: asyncio.Event, letters: DeadLetters
) -> None:
    """Follow aliases.changed from its end (older moves are already in the database); a record that does
    not decode goes to letters."""
    consumer = make_consumer(platform, topics.ALIASES_CHANGED.name, group_id=None, auto_offset_reset="latest")
    await consumer.start()
    try:
        ready.set()
        async for msg in consumer:
            event = await letters.parse_following(msg.topic, msg.partition, msg.offset, msg.value)
            if event is None:
                continue
            assert isinstance(event, AliasChanged)
            cache.apply(event)
            log.info("alias %s changed (revision %d): read again", event.alias, event.revision)
    finally:
        await consumer.stop()
