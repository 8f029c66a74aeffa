"""Where a closed window goes: adapter_stats rows in PostgreSQL, and events on the three output topics.

Both are idempotent: the upsert writes the same values again, and output events carry ids derived from
the window, so closing a window twice after a crash changes nothing a consumer can see.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

import asyncpg
import faust
from faust.types import RecordMetadata

from lorafleet.config import PlatformSettings
from lorafleet.db.conn import Connection
from lorafleet.db.pool import create_pool
from schemas.events import Event
from stats_stream.closing import WindowReport
from stats_stream.topics import StreamTopics
from stats_stream.windows import from_ms

UPSERT = """
INSERT INTO adapter_stats
    (adapter_id, window_start, requests, tokens_per_s, gpu_hit_rate, errors, p50_ttft_s, p95_ttft_s)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
ON CONFLICT (adapter_id, window_start) DO UPDATE
SET requests = EXCLUDED.requests, tokens_per_s = EXCLUDED.tokens_per_s, gpu_hit_rate = EXCLUDED.gpu_hit_rate,
    errors = EXCLUDED.errors, p50_ttft_s = EXCLUDED.p50_ttft_s, p95_ttft_s = EXCLUDED.p95_ttft_s
"""


async def write_adapter_stats(conn: Connection | asyncpg.Pool, report: WindowReport) -> None:
    rows = [
        (
            s.adapter_id,
            s.window_start,
            s.requests,
            s.tokens_per_s,
            s.gpu_hit_rate,
            s.errors,
            s.p50_ttft_s,
            s.p95_ttft_s,
        )
        for s in report.adapter_stats
    ]
    if rows:
        await conn.executemany(UPSERT, rows)


TENANT_UPSERT = """
INSERT INTO tenant_stats (tenant_id, window_start, window_seconds, requests, tokens, p50_ttft_s, p95_ttft_s,
                          cost_usd, usd_per_million_tokens)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
ON CONFLICT (tenant_id, window_start) DO UPDATE
SET window_seconds = EXCLUDED.window_seconds, requests = EXCLUDED.requests, tokens = EXCLUDED.tokens,
    p50_ttft_s = EXCLUDED.p50_ttft_s, p95_ttft_s = EXCLUDED.p95_ttft_s, cost_usd = EXCLUDED.cost_usd,
    usd_per_million_tokens = EXCLUDED.usd_per_million_tokens
"""


async def write_tenant_stats(conn: Connection | asyncpg.Pool, report: WindowReport, window_s: float) -> None:
    """One row per tenant with traffic in the window: its latencies and its share of the bill."""
    start = from_ms(report.window_ms)
    rows = []
    for tenant in sorted(set(report.latencies) | set(report.costs)):
        latency, cost = report.latencies.get(tenant), report.costs.get(tenant)
        rows.append(
            (
                tenant,
                start,
                window_s,
                latency.requests if latency else 0,
                cost.tokens if cost else 0,
                latency.p50_ttft_s if latency else None,
                latency.p95_ttft_s if latency else None,
                cost.cost_usd if cost else 0.0,
                cost.usd_per_million_tokens if cost else None,
            )
        )
    if rows:
        await conn.executemany(TENANT_UPSERT, rows)


class Sinks:
    """PostgreSQL (a small pool opened on first use) and the output topics."""

    def __init__(self, platform: PlatformSettings, topics: StreamTopics, window_s: float) -> None:
        self._platform = platform
        self._window_s = window_s
        self._topics = topics
        self._pool: asyncpg.Pool | None = None
        self._lock = asyncio.Lock()

    async def _db(self) -> asyncpg.Pool:
        async with self._lock:
            if self._pool is None:
                self._pool = await create_pool(self._platform, min_size=1, max_size=2)
            return self._pool

    async def write(self, report: WindowReport) -> None:
        """Store and publish a window; returns only once PostgreSQL committed and Kafka acknowledged."""
        db = await self._db()
        await write_adapter_stats(db, report)
        await write_tenant_stats(db, report, self._window_s)
        pending = [await self._send(self._topics.adapter_stats, e) for e in report.adapter_stats]
        pending += [await self._send(self._topics.alerts, e) for e in report.alerts]
        pending.append(await self._send(self._topics.autoscale, report.autoscale))
        await asyncio.gather(*pending)

    async def _send(self, topic: faust.TopicT, event: Event) -> Awaitable[RecordMetadata]:
        return await topic.send(key=event.key().encode(), value=event.to_bytes())

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
