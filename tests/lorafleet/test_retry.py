"""run_with_retry starts a failing worker over after a backoff, logs each failure, and ends when stopped."""

from __future__ import annotations

import asyncio
import logging

import pytest

from lorafleet.config import PlatformSettings
from lorafleet.retry import run_with_retry

FAST = PlatformSettings(retry_initial_s=0.01, retry_max_s=0.05)


async def test_a_worker_that_fails_is_run_again_until_it_returns(caplog: pytest.LogCaptureFixture) -> None:
    attempts = 0

    async def work(stop: asyncio.Event) -> None:
        nonlocal attempts
        attempts += 1
        if attempts < 4:
            raise ConnectionRefusedError("kafka is down")
        stop.set()

    stop = asyncio.Event()
    with caplog.at_level(logging.WARNING, logger="lorafleet.retry"):
        await asyncio.wait_for(run_with_retry("w", work, stop, FAST), 10)
    assert attempts == 4
    retries = [r.getMessage() for r in caplog.records if "failed (attempt" in r.getMessage()]
    assert len(retries) == 3 and "ConnectionRefusedError: kafka is down" in retries[0]


async def test_stop_during_an_outage_ends_the_loop_without_raising() -> None:
    stop = asyncio.Event()
    attempts = 0

    async def work(_stop: asyncio.Event) -> None:
        nonlocal attempts
        attempts += 1
        if attempts == 3:
            stop.set()
        raise OSError("postgres is down")

    await asyncio.wait_for(run_with_retry("w", work, stop, FAST), 10)
    assert attempts == 3


async def test_an_error_while_not_stopped_is_never_given_up_on() -> None:
    stop = asyncio.Event()
    attempts = 0

    async def work(_stop: asyncio.Event) -> None:
        nonlocal attempts
        attempts += 1
        raise OSError("still down")

    task = asyncio.create_task(run_with_retry("w", work, stop, FAST))
    while attempts < 20:
        await asyncio.sleep(0.01)
    assert not task.done()
    stop.set()
    await asyncio.wait_for(task, 5)
