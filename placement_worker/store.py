"""The placement worker's reads and writes in PostgreSQL: heartbeats, demand, placements."""

from __future__ import annotations

from datetime import UTC, datetime

import asyncpg

from placement_worker.membership import Heartbeat
from placement_worker.planner import Change, Placements

# One planner at a time: replans from several worker instances must not interleave.
PLAN_LOCK_KEY = 0x706C616E  # "plan"


async def upsert_heartbeat(
    conn: asyncpg.Connection, replica_id: str, url: str, status: str, at: datetime
) -> bool:
    """Record a replica.state; an older (replayed) one changes nothing. True when the row changed."""
    return bool(
        await conn.fetchval(
            """INSERT INTO replicas (replica_id, url, last_seen, status) VALUES ($1, $2, $3, $4)
               ON CONFLICT (replica_id) DO UPDATE
                   SET url = EXCLUDED.url, last_seen = EXCLUDED.last_seen, status = EXCLUDED.status
                   WHERE replicas.last_seen < EXCLUDED.last_seen
               RETURNING true""",
            replica_id,
            url,
            at,
            status,
        )
    )


async def heartbeats(conn: asyncpg.Connection | asyncpg.Pool, prefix: str) -> list[Heartbeat]:
    rows = await conn.fetch(
        "SELECT replica_id, status, last_seen FROM replicas WHERE starts_with(replica_id, $1)", prefix
    )
    return [Heartbeat(r["replica_id"], r["status"], r["last_seen"].timestamp()) for r in rows]


async def record_stats(
    conn: asyncpg.Connection, adapter_id: str, window_start: datetime, requests: int, tps: float, hit: float
) -> bool:
    """Store one traffic window of a known adapter once; True when it is new."""
    return bool(
        await conn.fetchval(
            """INSERT INTO adapter_stats (adapter_id, window_start, requests, tokens_per_s, gpu_hit_rate)
               SELECT $1, $2, $3, $4, $5 WHERE EXISTS (SELECT 1 FROM adapters WHERE adapter_id = $1)
               ON CONFLICT DO NOTHING RETURNING true""",
            adapter_id,
            window_start,
            requests,
            tps,
            hit,
        )
    )


async def demand(conn: asyncpg.Connection, adapter_ids: list[str] | None, ttl_s: float) -> dict[str, float]:
    """Ready adapters (all, or the given ones) -> tokens/s of their latest fresh window (0 if none)."""
    rows = await conn.fetch(
        """SELECT a.adapter_id, coalesce(s.tokens_per_s, 0) AS tps
           FROM adapters a
           LEFT JOIN LATERAL (
               SELECT tokens_per_s FROM adapter_stats st
               WHERE st.adapter_id = a.adapter_id AND st.window_start > now() - make_interval(secs => $2)
               ORDER BY st.window_start DESC LIMIT 1
           ) s ON true
           WHERE a.status = 'ready' AND ($1::text[] IS NULL OR a.adapter_id = ANY($1))""",
        adapter_ids,
        ttl_s,
    )
    return {r["adapter_id"]: float(r["tps"]) for r in rows}


async def retired(conn: asyncpg.Connection, adapter_ids: list[str] | None) -> frozenset[str]:
    """Versions an alias moved away from that no alias points at now (retired_versions, kept by a trigger)."""
    rows = await conn.fetch(
        "SELECT adapter_id FROM retired_versions WHERE ($1::text[] IS NULL OR adapter_id = ANY($1))",
        adapter_ids,
    )
    return frozenset(r["adapter_id"] for r in rows)


async def placements(conn: asyncpg.Connection, adapter_ids: list[str] | None, prefix: str) -> Placements:
    rows = await conn.fetch(
        """SELECT adapter_id, replica_id, tier FROM placements
           WHERE role = 'owner' AND starts_with(replica_id, $2)
             AND ($1::text[] IS NULL OR adapter_id = ANY($1))""",
        adapter_ids,
        prefix,
    )
    out: Placements = {}
    for r in rows:
        out.setdefault(r["adapter_id"], {})[r["replica_id"]] = r["tier"]
    return out


async def apply_changes(conn: asyncpg.Connection, changes: list[Change]) -> None:
    for c in changes:
        if c.command == "load":
            await conn.execute(
                """INSERT INTO placements (adapter_id, replica_id, role, tier) VALUES ($1, $2, 'owner', $3)
                   ON CONFLICT (adapter_id, replica_id) DO UPDATE SET role = 'owner', tier = EXCLUDED.tier""",
                c.adapter_id,
                c.replica_id,
                c.tier,
            )
        else:
            await conn.execute(
                "DELETE FROM placements WHERE adapter_id = $1 AND replica_id = $2", c.adapter_id, c.replica_id
            )


async def owners_of(conn: asyncpg.Connection, adapter_id: str, prefix: str) -> list[str]:
    rows = await conn.fetch(
        """SELECT replica_id FROM placements WHERE adapter_id = $1 AND role = 'owner'
           AND starts_with(replica_id, $2) ORDER BY replica_id""",
        adapter_id,
        prefix,
    )
    return [r["replica_id"] for r in rows]


def utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)
