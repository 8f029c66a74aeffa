"""What the fleet benchmark reads from the processes' own counters: the gateways' alias cache lookups and
routing decisions, how late the stats stream closes its windows, and the statements PostgreSQL ran for the
run's database."""

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
ROUTES = "gateway_routes"
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


async def summed(client: httpx.AsyncClient, gateways: list[str], family: str, *keys: str) -> dict[str, float]:
    """One counter family summed over the gateways' /metrics, by its labels' values at keys joined with /."""
    counts: dict[str, float] = {}
    for url in gateways:
        with contextlib.suppress(httpx.HTTPError):
            for labels, value in samples((await client.get(f"{url}/metrics", timeout=5.0)).text, family):
                key = "/".join(labels.get(k, "") for k in keys)
                counts[key] = counts.get(key, 0.0) + value
    return counts


async def alias_lookups(client: httpx.AsyncClient, gateways: list[str]) -> dict[str, Any]:
    """Lookups by outcome summed over the gateways' /metrics, and the share answered from the cache."""
    counts = await summed(client, gateways, ALIAS_LOOKUPS, "outcome")
    total = sum(counts.values())
    return {
        "lookups": {k: int(v) for k, v in sorted(counts.items())},
        "hit_rate": round(counts.get("hit", 0.0) / total, 4) if total else None,
    }


async def route_counts(client: httpx.AsyncClient, gateways: list[str]) -> dict[str, int]:
    """Requests routed so far, summed over the gateways, by "reason/choice" (gateway_routes_total)."""
    counts = await summed(client, gateways, ROUTES, "reason", "choice")
    return {k: int(v) for k, v in sorted(counts.items())}


def route_shares(before: dict[str, int], after: dict[str, int]) -> dict[str, Any]:
    """The routes counted between two reads; the share whose first choice was a spill, and the share served
    by a later replica than the first choice (it failed first)."""
    counts = {k: n - before.get(k, 0) for k, n in after.items() if n - before.get(k, 0)}
    total = sum(counts.values())

    def share(part: str, at: int) -> float | None:
        matching = sum(n for k, n in counts.items() if k.split("/")[at] == part)
        return round(matching / total, 4) if total else None

    return {"counts": counts, "spill_share": share("spill", 0), "fallback_share": share("fallback", 1)}


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
