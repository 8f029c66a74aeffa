"""The rate ledger that the churn test and the fault soak judge refunds by, on a real redis-server: it counts
the gateway limiter's reserves and refunds through a quiet spell, and refuses to answer once its MONITOR has
ended (its counts would miss every call since)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from redis.asyncio import Redis

from gateway.public.admission.rate_limit import Limits
from gateway.public.admission.shared_rate_limit import SharedRateLimiter
from harness.redis_server import redis_server
from harness.stacks.churn import RateLedger

pytestmark = pytest.mark.integration

TENANT = "acme"
LIMITS = Limits(100.0, 100_000)
QUIET_S = (
    6.0  # longer than redis-py's default read timeout (5 s): two chats mid-stream make no call this long
)


@asynccontextmanager
async def _limiter(url: str) -> AsyncIterator[SharedRateLimiter]:
    """The gateway's limiter on url, its scripts loaded (as before the soak's ledger starts)."""
    client = Redis.from_url(url)
    try:
        limiter = SharedRateLimiter(client, "ledger-test:")
        warm = await limiter.reserve("warm-up", LIMITS, 1)
        await limiter.refund("warm-up", 1, warm.store)
        yield limiter
    finally:
        await client.aclose()


async def _within(holds: Callable[[], bool], within_s: float = 5.0) -> bool:
    """Whether holds() came true within within_s (MONITOR reports a call just after it ran)."""
    deadline = time.monotonic() + within_s
    while not holds():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def test_a_refund_after_a_quiet_spell_is_counted(tmp_path: Path) -> None:
    with redis_server(tmp_path / "redis") as server:
        async with _limiter(server.url) as limiter, RateLedger(server.url) as ledger:
            reservation = await limiter.reserve(TENANT, LIMITS, 100)
            assert reservation.decision.admitted and reservation.store == "redis", reservation
            await asyncio.sleep(QUIET_S)  # a stream that outlasts the read timeout: no script call meanwhile
            await limiter.refund(TENANT, 40, reservation.store)
            counted = await _within(lambda: ledger.by_tenant(TENANT) == (1, 1, 40))
            assert counted, f"(reserves, refunds, tokens refunded) = {ledger.by_tenant(TENANT)}"


async def test_a_ledger_whose_monitor_ended_refuses_to_count(tmp_path: Path) -> None:
    with redis_server(tmp_path / "redis") as server:
        async with RateLedger(server.url) as ledger:
            assert ledger.stopped is None and ledger.by_tenant(TENANT) == (0, 0, 0)
            server.stop()
            assert await _within(lambda: ledger.stopped is not None), "the watch outlived its server"
            with pytest.raises(RuntimeError, match="stopped counting"):
                ledger.by_tenant(TENANT)
