"""What the fleet benchmark reads from the processes' own counters: the gateways' alias cache lookups, how
late the stats stream closes its windows, and the statements PostgreSQL ran for the run's database."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx
from prometheus_client.parser import text_string_to_metric_families

ALIAS_LOOKUPS = "gateway_alias_cache_lookups"
LAST_CLOSED = "lorafleet_stats_last_closed_window_start_seconds"


def samples(text: str, family: str) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of every sample of one metric family in a Prometheus text page."""
    return [
        (s.labels, s.value)
        for f in text_string_to_metric_families(text)
        if f.name == family
        for s in f.samples
        if s.name in (family, f"{family}_total")
    ]


async def alias_lookups(client: httpx.AsyncClient, gateways: list[str]) -> dict[str, Any]:
    """Lookups by outcome summed over the gateways' /metrics, and the share answered from the cache."""
    counts: dict[str, float] = {}
    for url in gateways:
        with contextlib.suppress(httpx.HTTPError):
            for labels, value in samples(
                (await client.get(f"{url}/metrics", timeout=5.0)).text, ALIAS_LOOKUPS
            ):
                counts[labels["outcome"]] = counts.get(labels["outcome"], 0.0) + value
    total = sum(counts.values())
    return {
        "lookups": {k: int(v) for k, v in sorted(counts.items())},
        "hit_rate": round(counts.get("hit", 0.0) / total, 4) if total else None,
    }


async def window_lateness(
    client: httpx.AsyncClient, url: str, window_s: float, stop: asyncio.Event, every_s: float = 0.5
) -> list[dict[str, float]]:
    """Poll the stats stream's /metrics until stop; for each window it closes, its start (unix s) and how
    long after its end the close was first seen (to within every_s)."""
    seen: float | None = None
    closes: list[dict[str, float]] = []
    while not stop.is_set():
        with contextlib.suppress(httpx.HTTPError, ValueError):
            found = samples((await client.get(f"{url}/metrics", timeout=2.0)).text, LAST_CLOSED)
            start = found[0][1] if found else 0.0
            if seen is not None and start > 0 and start != seen:
                closes.append({"start": start, "late_s": round(time.time() - (start + window_s), 2)})
            seen = start  # the first value read: what had closed before the run started
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)
    return closes


def _postgres_db(database_url: str) -> str:
    """The same server and login, database `postgres` (where the local stack keeps pg_stat_statements)."""
    parts = urlsplit(database_url)
    return urlunsplit(parts._replace(path="/postgres"))


async def statements(database_url: str, database: str) -> int | None:
    """Statements the server has run for `database` so far (pg_stat_statements' calls), or None where the
    module is not loaded or not readable."""
    try:
        conn = await asyncpg.connect(_postgres_db(database_url))
    except (OSError, asyncpg.PostgresError):
        return None
    try:
        value = await conn.fetchval(
            """SELECT sum(calls) FROM pg_stat_statements
               WHERE dbid = (SELECT oid FROM pg_database WHERE datname = $1)""",
            database,
        )
    except asyncpg.PostgresError:
        return None
    finally:
        await conn.close()
    return int(value or 0)
