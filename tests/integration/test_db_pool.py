"""Pools from lorafleet.db.pool bound waiting for a connection and a statement's run time."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest

from lorafleet.db.pool import create_pool

pytestmark = pytest.mark.integration


async def test_an_exhausted_pool_gives_up_waiting_after_the_acquire_timeout(services) -> None:
    settings = services.settings(db_acquire_timeout_s=0.5)
    pool = await create_pool(settings, min_size=1, max_size=1)
    try:
        async with pool.acquire():
            started = time.monotonic()
            with pytest.raises(TimeoutError):
                await pool.fetchval("SELECT 1")  # the pool's own query waits for the only connection
            assert 0.4 < time.monotonic() - started < 3.0
        assert await pool.fetchval("SELECT 1") == 1
    finally:
        await pool.close()


async def test_the_server_cancels_a_statement_past_the_statement_timeout(services) -> None:
    settings = services.settings(db_statement_timeout_ms=300, db_command_timeout_s=30)
    pool = await create_pool(settings, min_size=1, max_size=1)
    try:
        assert await pool.fetchval("SHOW statement_timeout") == "300ms"
        with pytest.raises(asyncpg.QueryCanceledError):
            await pool.execute("SELECT pg_sleep(5)")
    finally:
        await pool.close()


async def test_the_client_gives_up_on_a_query_past_the_command_timeout(services) -> None:
    settings = services.settings(db_statement_timeout_ms=0, db_command_timeout_s=0.3)
    pool = await create_pool(settings, min_size=1, max_size=1)
    try:
        started = time.monotonic()
        with pytest.raises(asyncio.TimeoutError):
            await pool.execute("SELECT pg_sleep(5)")
        assert time.monotonic() - started < 3.0
    finally:
        await pool.close()
