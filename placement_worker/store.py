"""The placement worker's reads and writes in PostgreSQL: heartbeats, demand, placements (owner and spill)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime

import asyncpg

from lorafleet.db.conn import Connection
from placement_worker.membership import Heartbeat
from placement_worker.planner import Change, Placements
from placement_worker.spill import SpillRow
from schemas.events import ResidentTier

# One planner at a time: replans from several worker instances must not interleave.
PLAN_LOCK_KEY = 0x706C616E  # "plan"


async def take_plan_lock(conn: Connection, wait_s: float) -> None:
    """Hold the plan lock until the transaction ends, waiting for it up to wait_s (then QueryCanceledError).
    Only the wait gets the longer bound: the statements after it keep the pool's statement timeout."""
    await conn.execute(f"SET LOCAL statement_timeout = {max(1, round(wait_s * 1000))}")
    await conn.execute("SELECT pg_advisory_xact_lock($1)", PLAN_LOCK_KEY, timeout=wait_s + 5.0)
    await conn.execute("SET LOCAL statement_timeout TO DEFAULT")


async def upsert_heartbeat(
    conn: Connection,
    replica_id: str,
    url: str,
    status: str,
    reported_at: datetime,
    received_at: datetime,
    gpu_slots: int = 0,
    stale_s: float = 10.0,
) -> bool:
    """Record a replica.state that arrived at received_at (this worker's clock), sent at reported_at (the
    replica's). A report older by the replica's own clock than the one held changes nothing while the held
    one is fresh (received within stale_s); once that is stale, the next report wins whatever its time, so a
    report dated in the future (its clock stepped back since) holds the row for stale_s at most. True when
    the row changed. warming_since keeps the first heartbeat of a warming run (NULL outside one)."""
    return bool(
        await conn.fetchval(
            """INSERT INTO replicas
                   (replica_id, url, last_seen, reported_at, status, gpu_slots, warming_since)
               VALUES ($1, $2, $3, $4, $5, $6, CASE WHEN $5 = 'warming' THEN $3::timestamptz END)
               ON CONFLICT (replica_id) DO UPDATE
                   SET url = EXCLUDED.url, last_seen = EXCLUDED.last_seen,
                       reported_at = EXCLUDED.reported_at, status = EXCLUDED.status,
                       gpu_slots = EXCLUDED.gpu_slots,
                       warming_since = CASE
                           WHEN EXCLUDED.status <> 'warming' THEN NULL
                           WHEN replicas.status = 'warming'
                               THEN coalesce(replicas.warming_since, EXCLUDED.last_seen)
                           ELSE EXCLUDED.last_seen END
                   WHERE replicas.reported_at IS NULL
                      OR replicas.reported_at < EXCLUDED.reported_at
                      OR replicas.last_seen < EXCLUDED.last_seen - make_interval(secs => $7)
               RETURNING true""",
            replica_id,
            url,
            received_at,
            reported_at,
            status,
            gpu_slots,
            stale_s,
        )
    )


async def heartbeats(conn: Connection | asyncpg.Pool, prefix: str) -> list[Heartbeat]:
    rows = await conn.fetch(
        """SELECT replica_id, status, last_seen, gpu_slots, status = 'warming'
                  AND (planned_through IS NULL OR planned_through < warming_since) AS joining
           FROM replicas WHERE starts_with(replica_id, $1)""",
        prefix,
    )
    return [
        Heartbeat(r["replica_id"], r["status"], r["last_seen"].timestamp(), r["gpu_slots"], r["joining"])
        for r in rows
    ]


async def mark_planned(conn: Connection, member_ids: list[str]) -> None:
    """A full replan counted these members in: each one's newest heartbeat is planned for."""
    await conn.execute(
        "UPDATE replicas SET planned_through = last_seen WHERE replica_id = ANY($1::text[])", member_ids
    )


async def record_stats(
    conn: Connection, adapter_id: str, window_start: datetime, requests: int, tps: float, hit: float
) -> bool:
    """Mark one traffic window of a known adapter as planned on; True when its tokens/s is news to the
    planner (the stats stream may have stored the row first: the row is kept, only the mark decides)."""
    return bool(
        await conn.fetchval(
            """INSERT INTO adapter_stats AS st
                   (adapter_id, window_start, requests, tokens_per_s, gpu_hit_rate, planned_tokens_per_s)
               SELECT $1, $2, $3, $4, $5, $4 WHERE EXISTS (SELECT 1 FROM adapters WHERE adapter_id = $1)
               ON CONFLICT (adapter_id, window_start)
               DO UPDATE SET planned_tokens_per_s = EXCLUDED.tokens_per_s
               WHERE st.planned_tokens_per_s IS DISTINCT FROM EXCLUDED.tokens_per_s
               RETURNING true""",
            adapter_id,
            window_start,
            requests,
            tps,
            hit,
        )
    )


async def demand(conn: Connection, adapter_ids: list[str] | None, ttl_s: float) -> dict[str, float]:
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


async def retired(conn: Connection, adapter_ids: list[str] | None) -> frozenset[str]:
    """Versions an alias moved away from that no alias points at now (retired_versions, kept by a trigger)."""
    rows = await conn.fetch(
        "SELECT adapter_id FROM retired_versions WHERE ($1::text[] IS NULL OR adapter_id = ANY($1))",
        adapter_ids,
    )
    return frozenset(r["adapter_id"] for r in rows)


async def placements(conn: Connection, adapter_ids: list[str] | None, prefix: str) -> Placements:
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


async def apply_changes(conn: Connection, changes: list[Change]) -> None:
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


async def traffic_shaped(conn: Connection | asyncpg.Pool, prefix: str, default_owners: int) -> list[str]:
    """Adapters whose placement their traffic shaped: more owners than the default, or a GPU placement."""
    rows = await conn.fetch(
        """SELECT adapter_id FROM placements WHERE role = 'owner' AND starts_with(replica_id, $1)
           GROUP BY adapter_id HAVING count(*) > $2 OR bool_or(tier = 'gpu') ORDER BY adapter_id""",
        prefix,
        default_owners,
    )
    return [r["adapter_id"] for r in rows]


async def placed_retired(conn: Connection, prefix: str) -> list[str]:
    """Retired versions that still have placements in this fleet (an ended canary, an operator's SQL)."""
    rows = await conn.fetch(
        """SELECT DISTINCT p.adapter_id FROM placements p JOIN retired_versions r USING (adapter_id)
           WHERE starts_with(p.replica_id, $1) ORDER BY p.adapter_id""",
        prefix,
    )
    return [r["adapter_id"] for r in rows]


async def owners_of(conn: Connection, adapter_id: str, prefix: str) -> list[str]:
    rows = await conn.fetch(
        """SELECT replica_id FROM placements WHERE adapter_id = $1 AND role = 'owner'
           AND starts_with(replica_id, $2) ORDER BY replica_id""",
        adapter_id,
        prefix,
    )
    return [r["replica_id"] for r in rows]


async def sync_spills(
    conn: Connection, replica_id: str, resident: Mapping[str, ResidentTier], at: datetime
) -> None:
    """Make a replica's spill rows what its newest state lists: each ready, unretired adapter it holds and
    does not own (new rows used at `at`, tiers refreshed); rows for adapters it no longer holds go."""
    ids = sorted(resident)
    await conn.execute(
        """INSERT INTO placements (adapter_id, replica_id, role, tier, last_used_at)
           SELECT r.adapter_id, $1, 'spill', r.tier, $4
           FROM unnest($2::text[], $3::text[]) AS r (adapter_id, tier)
           JOIN adapters a ON a.adapter_id = r.adapter_id AND a.status = 'ready'
           WHERE NOT EXISTS (SELECT 1 FROM retired_versions v WHERE v.adapter_id = r.adapter_id)
           ON CONFLICT (adapter_id, replica_id) DO UPDATE SET tier = EXCLUDED.tier
               WHERE placements.role = 'spill' AND placements.tier <> EXCLUDED.tier""",
        replica_id,
        ids,
        [resident[i] for i in ids],
        at,
    )
    await conn.execute(
        """DELETE FROM placements
           WHERE replica_id = $1 AND role = 'spill' AND NOT (adapter_id = ANY($2::text[]))""",
        replica_id,
        ids,
    )


async def touch_used(conn: Connection | asyncpg.Pool, adapter_id: str, replica_id: str, at: datetime) -> None:
    """A request for the adapter completed on the replica at `at`: its placement there was used."""
    await conn.execute(
        """UPDATE placements SET last_used_at = $3
           WHERE adapter_id = $1 AND replica_id = $2 AND (last_used_at IS NULL OR last_used_at < $3)""",
        adapter_id,
        replica_id,
        at,
    )


async def spills(conn: Connection, prefix: str) -> list[SpillRow]:
    rows = await conn.fetch(
        """SELECT adapter_id, replica_id, tier, last_used_at FROM placements
           WHERE role = 'spill' AND starts_with(replica_id, $1)""",
        prefix,
    )
    return [SpillRow(r["adapter_id"], r["replica_id"], r["tier"], r["last_used_at"]) for r in rows]


async def take_spills(conn: Connection, rows: list[SpillRow]) -> list[Change]:
    """Delete these spill rows (each only if unchanged since read); an unload for each one deleted."""
    changes: list[Change] = []
    for r in rows:
        gone = await conn.fetchval(
            """DELETE FROM placements WHERE adapter_id = $1 AND replica_id = $2 AND role = 'spill'
               AND last_used_at = $3 RETURNING true""",
            r.adapter_id,
            r.replica_id,
            r.last_used_at,
        )
        if gone:
            changes.append(Change(r.adapter_id, r.replica_id, "unload", r.tier))
    return changes


async def spills_of(conn: Connection, adapter_ids: list[str], prefix: str) -> list[SpillRow]:
    rows = await conn.fetch(
        """SELECT adapter_id, replica_id, tier, last_used_at FROM placements
           WHERE role = 'spill' AND adapter_id = ANY($1::text[]) AND starts_with(replica_id, $2)""",
        adapter_ids,
        prefix,
    )
    return [SpillRow(r["adapter_id"], r["replica_id"], r["tier"], r["last_used_at"]) for r in rows]


async def drop_spills(conn: Connection | asyncpg.Pool, prefix: str, keep_on: list[str]) -> int:
    """Forget spill rows on replicas outside keep_on (they left the fleet: no command); return how many."""
    rows = await conn.fetch(
        """DELETE FROM placements WHERE role = 'spill' AND starts_with(replica_id, $1)
           AND NOT (replica_id = ANY($2::text[])) RETURNING 1""",
        prefix,
        keep_on,
    )
    return len(rows)


def utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)
