"""Session-wide real services and per-test databases for the integration suite."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor

import asyncpg
import pytest
import pytest_asyncio

from harness.databases import throwaway_database
from lorafleet.db.migrate import migrate
from lorafleet.kafka import ensure_topics
from tests.integration import services as svc


@pytest.fixture(scope="session")
def services() -> Iterator[svc.ServiceAddresses]:
    source = svc.containers if svc.docker_answers() else svc.local
    with source() as addresses:
        # In a thread: asyncio.run here must not touch the event loop pytest-asyncio keeps for the session.
        with ThreadPoolExecutor(1) as pool_:
            pool_.submit(asyncio.run, ensure_topics(addresses.settings())).result()
        yield addresses


@pytest_asyncio.fixture
async def fresh_db(services: svc.ServiceAddresses) -> AsyncIterator[str]:
    """An empty database of its own for one test; dropped afterwards."""
    async with throwaway_database(services.database_url, f"t_{uuid.uuid4().hex[:12]}") as url:
        yield url


@pytest_asyncio.fixture
async def migrated_db(fresh_db: str) -> str:
    await migrate(fresh_db)
    return fresh_db


@pytest_asyncio.fixture
async def pool(migrated_db: str) -> AsyncIterator[asyncpg.Pool]:
    p = await asyncpg.create_pool(migrated_db, min_size=1, max_size=12)
    yield p
    await p.close()
