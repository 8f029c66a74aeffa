"""Polling for the integration tests: wait until an async condition holds, or fail saying what was awaited."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


async def wait_until(pred: Callable[[], Awaitable[bool]], what: str, timeout: float = 20.0) -> None:
    """Poll pred every 0.1 s; raise AssertionError naming `what` when it is still false after timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await pred():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")
