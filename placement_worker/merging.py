"""The placement worker's merged-replica decisions: glue between its events, merge_policy and PostgreSQL.

Each decision commits with its merged.target outbox event. adapter.stats counts a window (one transaction
per event, the row locked, so two workers cannot count one window twice); aliases.changed moves a merged
version's replica to the alias's new version inside the alias event's own exactly-once transaction; every
check_s, merged adapters whose windows stopped coming are demoted.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime

import asyncpg

from lorafleet.db.conn import Connection
from placement_worker import merged_store, store
from placement_worker.merge_policy import MergePolicy, moved_alias, observe, silent
from schemas.events import AdapterStats, AliasChanged

log = logging.getLogger(__name__)


class Merging:
    def __init__(self, policy: MergePolicy, fleet: str, check_s: float = 1.0) -> None:
        self.policy = policy
        self.fleet = fleet  # the worker's replica id prefix, named in each merged.target
        self.check_s = check_s
        self._next_check = 0.0

    async def on_stats(self, pool: asyncpg.Pool, event: AdapterStats) -> None:
        async with pool.acquire() as conn, conn.transaction():
            before = await merged_store.lock(conn, event.adapter_id)
            if before is None:
                return
            retired = event.adapter_id in await store.retired(conn, [event.adapter_id])
            after = observe(
                before,
                event.window_start,
                event.window_seconds,
                event.tokens_per_s,
                self.policy,
                datetime.now(UTC),
                retired,
            )
            if await merged_store.save(conn, event.adapter_id, before, after, self.fleet):
                log.info(
                    "merged replicas of %s: %d -> %d (%s, %.0f tok/s)",
                    event.adapter_id,
                    before.desired_replicas,
                    after.desired_replicas,
                    after.reason,
                    after.tokens_per_s,
                )

    async def on_alias_changed(self, conn: Connection, event: AliasChanged) -> None:
        """Inside the alias event's transaction: a merged previous version hands its merge to the new one."""
        previous = event.previous_adapter_id
        if previous is None or previous == event.adapter_id:
            return
        old = await merged_store.lock(conn, previous)
        new = await merged_store.lock(conn, event.adapter_id)
        if old is None or new is None:
            return
        old_after, new_after = moved_alias(old, new, datetime.now(UTC))
        await merged_store.save(conn, previous, old, old_after, self.fleet)
        await merged_store.save(conn, event.adapter_id, new, new_after, self.fleet)
        if old_after != old:
            log.info("alias %s moved: merged replica %s -> %s", event.alias, previous, event.adapter_id)

    async def tick(self, pool: asyncpg.Pool) -> None:
        """At most every check_s: demote merged adapters whose traffic windows stopped, and retired ones."""
        if time.monotonic() < self._next_check:
            return
        self._next_check = time.monotonic() + self.check_s
        now = datetime.now(UTC)
        async with pool.acquire() as conn, conn.transaction():
            current = await merged_store.merged(conn)
            if not current:
                return
            retired = await store.retired(conn, list(current))
            for adapter_id, before in current.items():
                after = silent(before, now, self.policy, adapter_id in retired)
                if await merged_store.save(conn, adapter_id, before, after, self.fleet):
                    log.info("merged replicas of %s: demoted (%s)", adapter_id, after.reason)
