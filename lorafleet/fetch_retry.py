"""Object-store downloads under one policy: a total deadline and a few retries with jittered backoff.

A download that keeps failing transiently (a 5xx, a reset connection, a stream that stalls past the
client's read timeout) is tried again up to `attempts` times; one that is still not done at `deadline_s`
(bytes trickling in, a store that stopped answering) is abandoned with TimeoutError. Any other error is
final at once: a missing object or a file over its cap does not get better with a retry.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential_jitter,
)

from lorafleet.config import PlatformSettings

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class FetchPolicy:
    """How long one download may take in all, and how often a transient failure is tried again."""

    deadline_s: float = 60.0
    attempts: int = 4
    initial_s: float = 0.2
    max_s: float = 2.0

    @classmethod
    def from_settings(cls, settings: PlatformSettings) -> FetchPolicy:
        return cls(
            settings.s3_fetch_deadline_s,
            settings.s3_fetch_attempts,
            settings.s3_retry_initial_s,
            settings.s3_retry_max_s,
        )


async def fetch_with_retry(
    fetch: Callable[[], Awaitable[T]],
    policy: FetchPolicy,
    transient: tuple[type[BaseException], ...],
    what: str,
) -> T:
    """await fetch(), again after each `transient` error (at most policy.attempts in all), within the
    deadline; TimeoutError past the deadline, the last transient error when the attempts run out."""

    def log_retry(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        wait = state.next_action.sleep if state.next_action is not None else 0.0
        log.warning("%s failed (attempt %d): %s; retrying in %.2fs", what, state.attempt_number, exc, wait)

    retrying = AsyncRetrying(
        retry=retry_if_exception_type(transient),
        stop=stop_after_attempt(policy.attempts),
        wait=wait_exponential_jitter(initial=policy.initial_s, max=policy.max_s),
        before_sleep=log_retry,
        reraise=True,
    )
    async with asyncio.timeout(policy.deadline_s):
        async for attempt in retrying:
            with attempt:
                return await fetch()
    raise AssertionError("tenacity ends with a result or the last error (reraise=True)")
