"""Run an event-driven worker as a process: until SIGTERM or SIGINT sets its stop event."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable


def run_until_signal(work: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """asyncio.run(work(stop)), where stop is set by SIGTERM or SIGINT so the worker can finish cleanly."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await work(stop)

    asyncio.run(main())
