"""Drain before stopped: the one drain of a replica, started by POST /internal/drain or SIGTERM.

Starting it turns the replica draining (published at once, so the router stops choosing it and the
placement worker moves its placements), after which generate refuses new requests. The drain then waits
until no request runs and no adapter is placed here, or until the deadline, where each request still
running ends with an error line (code replica_draining); then on_done stops the process.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from replica.control.placements import PlacementsTable
from replica.lifecycle import drain_verdict
from replica.runtime import Replica
from schemas.replica_api import DrainResponse

log = logging.getLogger(__name__)

EXPIRED_GRACE_S = 5.0  # after the deadline, how long the ended streams get to send their error line
EXPIRED_MESSAGE = "the replica is shutting down; retry the request"


class Drain:
    """Starts once; start() again answers the same drain."""

    def __init__(self, replica: Replica, table: PlacementsTable | None, on_done: Callable[[], None]) -> None:
        self.replica = replica
        self.table = table  # None: nothing is placed here (no control plane)
        self.on_done = on_done
        self.task: asyncio.Task[None] | None = None

    def start(self, deadline_s: float | None = None) -> DrainResponse:
        """Begin draining (from the event loop) or, if it has begun, report it."""
        life = self.replica.lifecycle
        if life.drain(deadline_s or self.replica.settings.drain_deadline_s, time.monotonic()):
            log.info(
                "draining: %d requests in flight, deadline %.1f s",
                len(self.replica.running),
                life.drain_deadline_s,
            )
            self.replica.state_changed.set()
            self.task = asyncio.create_task(self._run(), name="replica-drain")
        assert life.drain_deadline_s is not None  # set by the first drain
        return DrainResponse(
            replica_id=self.replica.settings.replica_id,
            in_flight=len(self.replica.running),
            deadline_s=life.drain_deadline_s,
        )

    async def _placed(self) -> int | None:
        if self.table is None:
            return 0
        try:
            return await self.table.owned_count()
        except Exception as exc:  # noqa: BLE001 - unknown counts as not moved; the deadline bounds it
            log.warning("cannot read this replica's placements (%s: %s)", type(exc).__name__, exc)
            return None

    async def _run(self) -> None:
        life, running = self.replica.lifecycle, self.replica.running
        assert life.drain_deadline_at is not None
        try:
            while True:
                placed = await self._placed()
                verdict = drain_verdict(len(running), placed, time.monotonic(), life.drain_deadline_at)
                if verdict == "exit":
                    log.info("drained: no request runs and no adapter is placed here")
                    return
                if verdict == "expire":
                    await self._expire(placed)
                    return
                await asyncio.sleep(self.replica.settings.lifecycle_poll_s)
        finally:
            self.on_done()

    async def _expire(self, placed: int | None) -> None:
        life, running = self.replica.lifecycle, self.replica.running
        life.expired = True
        ended = [
            rid for rid in sorted(running) if self.replica.engine.interrupt(rid, "drain", EXPIRED_MESSAGE)
        ]
        log.warning(
            "drain deadline passed: ending %d running requests (%d in flight), %s adapters still placed here",
            len(ended),
            len(running),
            "unknown" if placed is None else placed,
        )
        give_up = time.monotonic() + EXPIRED_GRACE_S
        while running and time.monotonic() < give_up:
            await asyncio.sleep(0.05)
