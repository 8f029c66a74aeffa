"""The disk copies behind loads: bytes fetched for a RAM entry are queued, and written to the disk tier in
the background once the slot (or RAM entry) is live; own() and settle() wait for them."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import NamedTuple

from replica.adapter_cache.object_store import Fetched
from replica.adapter_cache.promote import Layout
from replica.adapter_cache.tier import Tier

log = logging.getLogger(__name__)


class PendingWrite(NamedTuple):
    """Verified bytes whose disk copy is not started yet, and their layout."""

    fetched: Fetched
    layout: Layout


Write = Callable[[Fetched, Layout, Tier, float], Awaitable[str]]  # (bytes, layout, source, start) -> entry


class DiskWrites:
    """Queued and running disk copies, each keyed by its weights digest; write() does one copy."""

    def __init__(self, write: Write) -> None:
        self._write = write
        self.pending: dict[str, PendingWrite] = {}
        self.running: dict[str, asyncio.Future[None]] = {}

    def queue(self, digest: str, pending: PendingWrite) -> None:
        self.pending[digest] = pending

    def start(self) -> None:
        """Start a background write for every queued digest not being written already."""
        for digest in list(self.pending):
            pending = self.pending.pop(digest)
            if digest in self.running:
                continue
            task = asyncio.ensure_future(self._background(pending))
            self.running[digest] = task
            task.add_done_callback(partial(self._forget, digest))

    async def wait(self, digest: str | None = None) -> None:
        """Until the running writes (of this digest, or all) have finished."""
        tasks = [t for d, t in self.running.items() if digest is None or d == digest]
        await asyncio.gather(*tasks, return_exceptions=True)

    def _forget(self, digest: str, task: asyncio.Future[None]) -> None:
        if self.running.get(digest) is task:  # a later write of the same digest may have replaced it
            del self.running[digest]

    async def _background(self, pending: PendingWrite) -> None:
        try:
            await self._write(pending.fetched, pending.layout, "ram", time.perf_counter())
        except Exception:  # noqa: BLE001 - the RAM entry serves; the disk copy is fetched again when needed
            log.exception("could not write adapter %s to the disk tier", pending.fetched.weights_digest[:16])
