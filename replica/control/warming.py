"""Warm before routed: watch the adapters placed on this replica until it holds them all, then turn ready.

The load commands arrive on the command path (commands.py); this loop only reads the placement worker's
tables (placements.py) and the cache's tiers, reports progress and makes the one decision (lifecycle.py).
A database that cannot be read counts as "not planned yet", so the warming timeout still bounds the wait.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import datetime

from replica.control.placements import PlacementsTable
from replica.lifecycle import Lifecycle, warm_count, warming_verdict
from schemas.events import ResidentTier, Tier

log = logging.getLogger(__name__)


async def warm_up(
    lifecycle: Lifecycle,
    table: PlacementsTable,
    tier_of: Callable[[str], Tier],
    since: datetime,
    timeout_s: float,
    poll_s: float,
    changed: Callable[[], None],
) -> None:
    """Poll every poll_s until the replica is ready (or no longer warming); `changed` on every new status
    or progress, so replica.state goes out at once. `since`: when warming began (wall clock, UTC)."""
    started = time.monotonic()
    try:
        while lifecycle.status == "warming":
            planned, owned = await _read(table, since)
            held = {adapter_id: tier_of(adapter_id) for adapter_id in owned}
            progress = (len(owned), warm_count(owned, held))
            if progress != (lifecycle.owned_adapters, lifecycle.warm_adapters):
                lifecycle.progress(*progress)
                changed()
            verdict = warming_verdict(planned, owned, held, time.monotonic() - started, timeout_s)
            if verdict != "wait" and lifecycle.become_ready():
                _log_ready(verdict, timeout_s, planned, progress)
                changed()
                return
            await asyncio.sleep(poll_s)
    finally:
        if lifecycle.status == "ready":  # a ready replica holds no database connection; a drain opens one
            await table.close()


async def _read(table: PlacementsTable, since: datetime) -> tuple[bool, dict[str, ResidentTier]]:
    """(planned since `since`, the adapters this replica owns); unreadable counts as not planned."""
    try:
        if await table.planned_since(since):
            return True, await table.owned()
    except Exception as exc:  # noqa: BLE001 - unreadable counts as not planned; the timeout bounds it
        log.warning("cannot read this replica's placements (%s: %s); retrying", type(exc).__name__, exc)
    return False, {}


def _log_ready(verdict: str, timeout_s: float, planned: bool, progress: tuple[int, int]) -> None:
    owned, warm = progress
    if verdict == "timeout":
        log.warning(
            "warming timed out after %.0f s (planned=%s, %d/%d owned adapters warm): ready anyway",
            timeout_s,
            planned,
            warm,
            owned,
        )
    else:
        log.info("replica is ready: %d/%d owned adapters warm", warm, owned)
