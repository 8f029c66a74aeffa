"""The placement worker's plan lock: its wait has its own bound, the statements after it keep the pool's."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest

from lorafleet.db.pool import create_pool
from placement_worker import store

pytestmark = pytest.mark.integration


async def _hold_lock(pool: asyncpg.Pool, taken: asyncio.Event, seconds: float) -> None:
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", store.PLAN_LOCK_KEY)
        taken.set()
        await asyncio.sleep(seconds)


async def test_a_wait_for_the_plan_lock_outlasts_the_statement_timeout_and_the_next_statement_does_not(
    services,
) -> None:
    settings = services.settings(db_statement_timeout_ms=300, db_command_timeout_s=0.5)
    pool = await create_pool(settings, min_size=2, max_size=2)
    try:
        taken = asyncio.Event()
        holder = asyncio.create_task(_hold_lock(pool, taken, 1.5))
        await asyncio.wait_for(taken.wait(), 30)
        async with pool.acquire() as conn, conn.transaction():
            started = time.monotonic()
            await store.take_plan_lock(conn, wait_s=30)
            assert time.monotonic() - started > 1.0  # it waited for the holder, past both timeouts
            assert await conn.fetchval("SHOW statement_timeout") == "300ms"
            with pytest.raises(asyncpg.QueryCanceledError):
                await conn.execute("SELECT pg_sleep(2)")
        await holder
    finally:
        await pool.close()


async def test_a_wait_for_the_plan_lock_gives_up_at_its_own_bound(services) -> None:
    settings = services.settings(db_statement_timeout_ms=10_000, db_command_timeout_s=30)
    pool = await create_pool(settings, min_size=2, max_size=2)
    try:
        taken = asyncio.Event()
        holder = asyncio.create_task(_hold_lock(pool, taken, 10))
        await asyncio.wait_for(taken.wait(), 30)
        started = time.monotonic()
        with pytest.raises(asyncpg.QueryCanceledError):
            async with pool.acquire() as conn, conn.transaction():
                await store.take_plan_lock(conn, wait_s=0.5)
        assert time.monotonic() - started < 5.0
        holder.cancel()
        with pytest.raises(asyncio.CancelledError):
            await holder
    finally:
        await pool.close()
