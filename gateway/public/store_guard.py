"""Every read of PostgreSQL on the public path goes through one guard: bounded by a deadline, and after a
failure skipped for a pause, so that requests answer from the caches (or with a 503) at once instead of
each waiting out the deadline again."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import asyncpg

from gateway.errors import STORE_DOWN, StoreUnavailable
from gateway.public.pause import Pause

log = logging.getLogger(__name__)

T = TypeVar("T")


class StoreGuard:
    """read(fn) runs fn within deadline_s; a store failure raises StoreUnavailable and opens a pause."""

    def __init__(self, deadline_s: float, pause_s: float) -> None:
        self.deadline_s = deadline_s
        self.pause = Pause(pause_s)
        self.failures = 0

    def down(self) -> bool:
        return self.pause.active()

    async def read(self, fn: Callable[[], Awaitable[T]]) -> T:
        if self.down():
            raise StoreUnavailable()
        # A task of its own, not asyncio.timeout around the await: asyncpg cancelling a query that a
        # paused server never answers waits on that server, which would stretch the deadline.
        task = asyncio.ensure_future(fn())
        try:
            done, _ = await asyncio.wait({task}, timeout=self.deadline_s)
            if not done:
                task.cancel()
                task.add_done_callback(_drop_result)
                raise TimeoutError(f"no answer within {self.deadline_s}s")
            return task.result()
        except STORE_DOWN as exc:
            self.failures += 1
            self.pause.start()
            log.warning(
                "registry store read failed (%s: %s); caches answer alone for %.1fs",
                type(exc).__name__,
                exc,
                self.pause.duration_s,
            )
            raise StoreUnavailable() from exc


# what a failed background refresh raises: the store unreachable, too slow or refusing the statement
REFRESH_FAILED: tuple[type[Exception], ...] = (*STORE_DOWN, TimeoutError, asyncpg.PostgresError)


async def keep_fresh(
    what: str, period_s: float, refresh: Callable[[], Awaitable[object]], counted: Callable[[str], None]
) -> None:
    """refresh() every period_s, for good, off the requests' path; each outcome (ok, failed) goes to counted.
    A failed one leaves the cache's entries to their TTL, and their requests to the guarded reads."""
    while True:
        try:
            await refresh()
        except REFRESH_FAILED as exc:
            counted("failed")
            log.warning("refreshing %s failed (%s: %s)", what, type(exc).__name__, exc)
        else:
            counted("ok")
        await asyncio.sleep(period_s)


def _drop_result(task: asyncio.Future[Any]) -> None:
    """Retrieve a given-up read's outcome, so that asyncio does not log it as never retrieved."""
    if not task.cancelled():
        task.exception()
