"""The placement worker's event handlers: each records its input idempotently, then replans what it
touched (which event replans what, and why: docs/placement.md)."""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime

import asyncpg

from lorafleet.db.conn import Connection
from lorafleet.feed import FeedWatch
from lorafleet.outbox.idempotency import apply_once
from placement_worker import producer, store
from placement_worker.config import PlacementSettings
from placement_worker.membership import Heartbeat, SilenceGuard, joining
from placement_worker.merging import Merging
from placement_worker.planner import (
    Change,
    Policy,
    desired,
    diff,
    prewarm_targets,
    resend_owned,
    touches_gpu_share,
)
from placement_worker.spill import idle, resident_tiers
from schemas.events import AdapterStats, AdapterValidated, AliasChanged, Event, ReplicaState, RequestCompleted

log = logging.getLogger(__name__)

CONSUMER = "placement-worker"


class PlacementWorker:
    """Thin glue between events, the pure planner and PostgreSQL."""

    def __init__(self, pool: asyncpg.Pool, settings: PlacementSettings) -> None:
        self._pool = pool
        self._s = settings
        self._policy = Policy(
            settings.default_owners,
            settings.replica_capacity_tokens_per_s,
            settings.gpu_tokens_per_s,
            settings.gpu_slot_fraction,
            settings.shrink_utilization,
        )
        self._members: dict[str, int] | None = None  # replica -> GPU slots, at the last full replan
        # many replicas silent at once stay members a while: a stall, not deaths, until shown otherwise
        self._membership = SilenceGuard(settings.silence_share, settings.silence_hold_s)
        self._held: set[str] = set()  # the silent members held at the last look (logged when it changes)
        # heartbeats and usage arrive through Kafka: while it is down, membership and idleness stand still
        self.feed = FeedWatch(allowance_s=min(1.0, settings.tick_s), clock=time.time)
        self._dirty: set[str] = set()  # adapters with a new stats window, replanned at most once per tick_s
        self._next_dirty = 0.0
        self._next_expiry = 0.0
        self._next_decay = time.monotonic() + settings.decay_check_s
        self._merging = Merging(settings.merge_policy(), settings.replica_id_prefix, settings.merge_check_s)

    async def handle(self, event: Event) -> None:
        """Apply the event with its type's handler; the worker ignores other event types."""
        match event:
            case AdapterValidated():
                await self.on_validated(event)
            case AdapterStats():
                await self.on_stats(event)
            case ReplicaState():
                await self.on_replica_state(event)
            case AliasChanged():
                await self.on_alias_changed(event)
            case RequestCompleted():
                await self.on_request_completed(event)

    async def replan(
        self, conn: Connection, adapter_ids: list[str] | None, fleet: list[str] | None = None
    ) -> list[Change]:
        """Bring the placements of the given adapters (None: all) to the plan for the members (fleet, or the
        members now)."""
        await store.take_plan_lock(conn, self._s.plan_lock_wait_s)
        prefix, ttl = self._s.replica_id_prefix, self._s.demand_ttl_s
        beats = await store.heartbeats(conn, prefix)
        fleet = self._fleet(beats) if fleet is None else fleet
        slots = {b.replica_id: b.gpu_slots for b in beats}
        demand = await store.demand(conn, adapter_ids, ttl)
        current = await store.placements(conn, adapter_ids, prefix)
        if adapter_ids is not None and touches_gpu_share(demand, current, self._policy):
            demand = await store.demand(conn, None, ttl)  # the ranking needs every adapter with traffic
            current = await store.placements(conn, None, prefix)
            adapter_ids = None
        retired = await store.retired(conn, adapter_ids)
        target = desired(demand, fleet, self._policy, retired, slots, current)
        for adapter_id in current.keys() - target.keys():
            target[adapter_id] = {}  # placed but no longer ready here: cannot happen, but never leave strays
        changes = diff(current, target)
        await store.apply_changes(conn, changes)
        unowned = sorted(a for a, want in target.items() if not want)  # retired: no copy may stay anywhere
        changes += await store.take_spills(
            conn, await store.spills_of(conn, unowned, self._s.replica_id_prefix)
        )
        resent: list[Change] = []
        if adapter_ids is None:  # a full replan: every member has heard of everything it owns
            resent = resend_owned(target, joining(beats, fleet), changes)
            await store.mark_planned(conn, fleet)
        await producer.emit_changes(conn, changes + resent)
        return changes

    async def on_validated(self, event: AdapterValidated) -> None:
        async def effect(conn: Connection) -> None:
            if event.status == "ready":
                changes = await self.replan(conn, [event.adapter_id])
                if changes:
                    log.info("placed %s: %d changes", event.adapter_id, len(changes))

        async with self._pool.acquire() as conn:
            await apply_once(conn, CONSUMER, event.event_id, effect)

    async def on_stats(self, event: AdapterStats) -> None:
        async with self._pool.acquire() as conn:
            new = await store.record_stats(
                conn,
                event.adapter_id,
                event.window_start,
                event.requests,
                event.tokens_per_s,
                event.gpu_hit_rate,
            )
        if new:
            self._dirty.add(event.adapter_id)
        await self._merging.on_stats(self._pool, event)

    async def on_alias_changed(self, event: AliasChanged) -> None:
        async def effect(conn: Connection) -> None:
            served = [event.adapter_id] + ([event.canary_adapter_id] if event.canary_adapter_id else [])
            moved = served + ([event.previous_adapter_id] if event.previous_adapter_id else [])
            moved += await store.placed_retired(conn, self._s.replica_id_prefix)  # e.g. an ended canary
            changes = await self.replan(conn, sorted(set(moved)))
            if changes:
                log.info("alias %s moved to %s: %d changes", event.alias, served, len(changes))
            await self._merging.on_alias_changed(conn, event)
            serving = await store.demand(conn, served, self._s.demand_ttl_s)
            for adapter_id in served:
                owners = await store.owners_of(conn, adapter_id, self._s.replica_id_prefix)
                # the alias's target takes over a previous version's traffic, unless it is serving already
                # (a canary's start, weight or end leaves its target as it was)
                takes_over = (
                    adapter_id == event.adapter_id
                    and event.previous_adapter_id is not None
                    and not serving.get(adapter_id)
                )
                await producer.emit_prewarm(conn, adapter_id, prewarm_targets(adapter_id, owners, takes_over))

        async with self._pool.acquire() as conn:
            await apply_once(conn, CONSUMER, event.event_id, effect)

    async def on_replica_state(self, event: ReplicaState) -> None:
        if not event.replica_id.startswith(self._s.replica_id_prefix):
            return
        if event.merged_adapter_id is not None:  # serves only its merged adapter: never a placement target
            return
        received = datetime.now(UTC)  # membership is timed on this worker's clock, never the replica's
        async with self._pool.acquire() as conn, conn.transaction():
            newer = await store.upsert_heartbeat(
                conn,
                event.replica_id,
                event.url,
                event.status,
                reported_at=event.occurred_at,
                received_at=received,
                gpu_slots=event.gpu_slots,
                stale_s=self._s.membership_ttl_s,
            )
            if newer:  # a replayed or reordered older state must not bring back an evicted copy
                held = resident_tiers(event.gpu_adapters, event.ram_adapters, event.disk_adapters)
                await store.sync_spills(
                    conn, event.replica_id, held if event.status == "ready" else {}, received
                )
        await self.tick()

    async def on_request_completed(self, event: RequestCompleted) -> None:
        replica_id = event.replica_id
        if replica_id is not None and replica_id.startswith(self._s.replica_id_prefix):
            await store.touch_used(self._pool, event.adapter_id, replica_id, event.occurred_at)

    async def tick(self) -> list[Change]:
        """Replan everything when the member set (or a member's GPU slots) changed since the last look
        (joins, leaves, timeouts), else, at most once per tick_s, the adapters with new stats windows and,
        every decay_check_s, the ones whose traffic shaped their placement (it may have aged out); at most
        once a second, unload spill copies that went idle."""
        changes = await self._expire_spills()
        await self._merging.tick(self._pool)
        if self.feed.ok_at is None:  # replica.state not yet read to its end: the fleet is not known yet
            return changes
        beats = await store.heartbeats(self._pool, self._s.replica_id_prefix)
        now_members = self._fleet(beats)
        slots = {b.replica_id: b.gpu_slots for b in beats if b.replica_id in now_members}
        if slots == self._members and time.monotonic() >= self._next_decay:
            self._next_decay = time.monotonic() + self._s.decay_check_s
            shaped = await store.traffic_shaped(self._pool, self._s.replica_id_prefix, self._s.default_owners)
            self._dirty.update(shaped)  # replanned below with this tick's new windows
        dirty = sorted(self._dirty)
        if slots == self._members and not joining(beats, now_members):
            if dirty and time.monotonic() >= self._next_dirty:  # tick() also runs on every replica.state
                async with self._pool.acquire() as conn, conn.transaction():
                    changes += await self.replan(conn, dirty)
                self._dirty.difference_update(dirty)
                self._next_dirty = time.monotonic() + self._s.tick_s
            return changes
        async with self._pool.acquire() as conn, conn.transaction():
            changes += await self.replan(conn, None, now_members)
            dropped = await store.drop_spills(conn, self._s.replica_id_prefix, now_members)
        self._dirty.difference_update(dirty)
        log.info(
            "fleet is now %d replicas (was %s): %d placement changes, %d spill copies forgotten",
            len(now_members),
            None if self._members is None else len(self._members),
            len(changes),
            dropped,
        )
        self._members = slots
        return changes

    def _fleet(self, beats: list[Heartbeat]) -> list[str]:
        """The members now, as the silence guard judges them; logs when a hold starts and how it ends."""
        now, ttl, guard = self.feed.now(), self._s.membership_ttl_s, self._membership
        fleet = guard.members(beats, now, ttl)
        held = guard.holding(beats, now, ttl)
        if held and not self._held:
            log.warning(
                "%d of %d replicas went silent together: kept as members for up to %.0f s (a stall, not "
                "deaths, until shown otherwise)",
                len(guard.held),
                len(guard.accepted),
                guard.hold_s,
            )
        elif self._held and not held:
            gone = self._held.difference(fleet)
            if gone:
                log.warning("%d held replicas leave the fleet: silent past the hold, or draining", len(gone))
            else:
                log.info("the %d held replicas reported again", len(self._held))
        self._held = held
        return fleet

    async def _expire_spills(self) -> list[Change]:
        if time.monotonic() < self._next_expiry:
            return []
        self._next_expiry = time.monotonic() + 1.0
        async with self._pool.acquire() as conn, conn.transaction():
            await store.take_plan_lock(conn, self._s.plan_lock_wait_s)
            rows = await store.spills(conn, self._s.replica_id_prefix)
            changes = await store.take_spills(
                conn, idle(rows, store.utc(self.feed.now()), self._s.spill_idle_s)
            )
            await producer.emit_changes(conn, changes)
        if changes:
            log.info("unloaded %d idle spill copies", len(changes))
        return changes
