"""Keep a worker running through Kafka and PostgreSQL outages: on an error, log it and start over.

Each attempt opens its own clients, so an attempt after an outage starts from fresh connections; the
consumers' offsets, the outbox's unsent flag and `apply_once` make a start-over lose and double nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential_jitter

from lorafleet.config import PlatformSettings

log = logging.getLogger(__name__)

Work = Callable[[asyncio.Event], Awaitable[None]]


async def run_with_retry(name: str, work: Work, stop: asyncio.Event, settings: PlatformSettings) -> None:
    """await work(stop) until stop is set; each exception is logged and retried after a backoff."""

    def stopped(_state: RetryCallState) -> bool:
        return stop.is_set()

    def log_retry(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        wait = state.next_action.sleep if state.next_action is not None else 0.0
        log.warning(
            "%s failed (attempt %d): %s: %s; retrying in %.1fs",
            name,
            state.attempt_number,
            type(exc).__name__,
            exc,
            wait,
        )

    async def sleep_or_stop(seconds: float) -> None:
        try:
            await asyncio.wait_for(stop.wait(), timeout=seconds)
        except TimeoutError:
            pass

    async def attempt() -> None:
        await work(stop)

    retrying = AsyncRetrying(
        retry=retry_if_exception_type(Exception),
        wait=wait_exponential_jitter(initial=settings.retry_initial_s, max=settings.retry_max_s),
        stop=stopped,
        sleep=sleep_or_stop,
        before_sleep=log_retry,
        reraise=True,
    )
    try:
        await retrying(attempt)
    except Exception as exc:
        if not stop.is_set():
            raise
        log.info("%s stopped while failing: %s", name, exc)
