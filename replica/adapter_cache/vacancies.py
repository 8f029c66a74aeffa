"""Wake the requests waiting for a GPU slot when one may have come free, instead of each polling.

A waiter takes `event` before it checks for room, then waits on that event: a hold that ends after the check
sets it, so no wake-up is lost between the check and the wait. Event-loop only, like AdapterCache.
"""

from __future__ import annotations

import asyncio
import contextlib


class Vacancies:
    def __init__(self) -> None:
        self.event = asyncio.Event()

    def notify(self) -> None:
        """A hold ended or an adapter left its slot: every waiter looks again."""
        self.event.set()
        self.event = asyncio.Event()

    @staticmethod
    async def wait(event: asyncio.Event, timeout_s: float) -> None:
        """Until `event` is set or timeout_s passes (a slot freed off the loop wakes no one)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout_s)
