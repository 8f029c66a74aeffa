"""Throwaway PostgreSQL databases for benchmark and test stacks: created empty, dropped afterwards.

The drop survives a busy autovacuum worker: DROP ... WITH (FORCE) is refused while one works in the
database, because an unprivileged role may not signal that process ("must be a member of the role whose
process is being terminated"). So the drop ends the role's own sessions there, then runs a plain DROP,
which stops autovacuum workers itself and waits a few seconds for the ended sessions to go.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from urllib.parse import urlparse, urlunparse

import asyncpg


def database_url(url: str, name: str) -> str:
    """url with its database replaced by `name` (host, credentials and options kept)."""
    return urlunparse(urlparse(url)._replace(path=f"/{name}"))


async def create_database(url: str, name: str) -> str:
    """Create the empty database `name` (connecting through url's database); its URL."""
    admin = await asyncpg.connect(url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    return database_url(url, name)


async def drop_database(url: str, name: str) -> None:
    """Drop database `name` (connecting through url's database), ending this role's sessions in it first."""
    admin = await asyncpg.connect(url)
    try:
        await admin.execute(
            """SELECT pg_terminate_backend(pid) FROM pg_stat_activity
               WHERE datname = $1 AND usename = current_user AND pid <> pg_backend_pid()""",
            name,
        )
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
    finally:
        await admin.close()


@contextlib.asynccontextmanager
async def throwaway_database(url: str, name: str) -> AsyncIterator[str]:
    """The URL of a new empty database `name`, dropped on the way out (also when the body raises)."""
    created = await create_database(url, name)
    try:
        yield created
    finally:
        await drop_database(url, name)


async def drop_roles(url: str, names: list[str]) -> None:
    """Drop these login roles (connecting through url); roles belong to the cluster, not to a database."""
    admin = await asyncpg.connect(url)
    try:
        for name in names:
            quoted = await admin.fetchval("SELECT quote_ident($1)", name)
            await admin.execute(f"DROP ROLE IF EXISTS {quoted}")
    finally:
        await admin.close()
