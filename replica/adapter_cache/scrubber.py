"""The disk tier's scrubber: re-hash one entry with sha256 every interval, off the request path.

Promotion proves a disk entry by its files' identities, which a write through the filesystem always changes
but silent media corruption does not; the scrubber catches that, at a rate low enough to cost nothing (one
80 MB adapter per minute is 1.3 MB/s of reads and ~0.1% of a core). A mismatch drops the entry: the next
promotion fetches it again from the object store. AdapterCache.scrub_once does one step.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

log = logging.getLogger(__name__)


class Scrubbable(Protocol):
    async def scrub_once(self) -> str | None: ...


async def scrub_forever(cache: Scrubbable, interval_s: float, stop: asyncio.Event) -> None:
    """One entry every interval_s until stop; a failed step is logged and the next one runs."""
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), interval_s)
            return
        except TimeoutError:
            pass
        try:
            await cache.scrub_once()  # a dropped entry is logged and reported as a disk eviction
        except Exception:  # noqa: BLE001 - the scrubber must outlive one bad step
            log.exception("disk scrub step failed")
