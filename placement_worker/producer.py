"""Turn planned changes into replica.commands events, written to the outbox with the placement rows."""

from __future__ import annotations

from lorafleet.db.conn import Connection
from lorafleet.outbox.writer import emit
from placement_worker.planner import Change
from schemas.events import ReplicaCommand


def command_for(change: Change) -> ReplicaCommand:
    return ReplicaCommand(
        replica_id=change.replica_id,
        command=change.command,
        adapter_id=change.adapter_id,
        target_tier=change.tier,
    )


async def emit_changes(conn: Connection, changes: list[Change]) -> None:
    for change in changes:
        await emit(conn, command_for(change))


async def emit_prewarm(conn: Connection, adapter_id: str, replica_ids: list[str]) -> None:
    """Ask these replicas to bring an adapter into GPU slots ahead of traffic (an alias just moved to it)."""
    for replica_id in replica_ids:
        await emit(
            conn,
            ReplicaCommand(
                replica_id=replica_id, command="prewarm", adapter_id=adapter_id, target_tier="gpu"
            ),
        )
