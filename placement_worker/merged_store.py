"""The merged_targets rows in PostgreSQL, and the merged.target event written beside each decision."""

from __future__ import annotations

from lorafleet.db.conn import Connection
from lorafleet.outbox.writer import emit
from placement_worker.merge_policy import MergeState
from schemas.events import MergedTarget

_COLUMNS = (
    "desired_replicas, above, below, last_window_start, window_seconds, tokens_per_s, reason,"
    " updated_at AS seen_at"
)


async def lock(conn: Connection, adapter_id: str) -> MergeState | None:
    """The adapter's row, locked until the transaction ends (created empty); None for an unknown adapter."""
    await conn.execute(
        """INSERT INTO merged_targets (adapter_id)
           SELECT $1 WHERE EXISTS (SELECT 1 FROM adapters WHERE adapter_id = $1)
           ON CONFLICT (adapter_id) DO NOTHING""",
        adapter_id,
    )
    row = await conn.fetchrow(
        f"SELECT {_COLUMNS} FROM merged_targets WHERE adapter_id = $1 FOR UPDATE", adapter_id
    )
    return None if row is None else MergeState(**dict(row))


async def merged(conn: Connection) -> dict[str, MergeState]:
    """Every adapter with merged replicas wanted now, its row locked until the transaction ends."""
    rows = await conn.fetch(
        f"""SELECT adapter_id, {_COLUMNS} FROM merged_targets WHERE desired_replicas > 0
            ORDER BY adapter_id FOR UPDATE"""
    )
    return {r["adapter_id"]: MergeState(**{k: r[k] for k in r.keys() if k != "adapter_id"}) for r in rows}


async def save(conn: Connection, adapter_id: str, before: MergeState, after: MergeState, fleet: str) -> bool:
    """Write the row; when the decision changed, its merged.target event (for the fleet: the replica id
    prefix) goes in the same transaction. True when it did."""
    if after == before:
        return False
    await conn.execute(
        """UPDATE merged_targets SET desired_replicas = $2, above = $3, below = $4, last_window_start = $5,
               window_seconds = $6, tokens_per_s = $7, reason = $8, updated_at = coalesce($9, now())
           WHERE adapter_id = $1""",
        adapter_id,
        after.desired_replicas,
        after.above,
        after.below,
        after.last_window_start,
        after.window_seconds,
        after.tokens_per_s,
        after.reason,
        after.seen_at,
    )
    if after.desired_replicas == before.desired_replicas or after.reason is None:
        return False
    await emit(
        conn,
        MergedTarget(
            adapter_id=adapter_id,
            desired_replicas=after.desired_replicas,
            tokens_per_s=after.tokens_per_s,
            reason=after.reason,
            fleet=fleet,
        ),
    )
    return True
