"""Throwaway databases for integration tests: dropped so that a busy autovacuum worker cannot fail the drop."""

from __future__ import annotations

import asyncpg


async def drop_database(url: str, name: str) -> None:
    """Drop database `name` (connecting through url's database).

    DROP ... WITH (FORCE) is refused when an autovacuum worker happens to be working in it: the test role may
    not signal that process ("must be a member of the role whose process is being terminated"), which
    failed a CI run at teardown. So this ends the role's own sessions there, then runs a plain DROP, which
    stops autovacuum workers itself and waits a few seconds for the ended sessions to go.
    """
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
