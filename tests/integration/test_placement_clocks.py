"""Membership is timed on the placement worker's clock, never a replica's, on the real PostgreSQL: a replica
whose clock runs a minute behind is a member while its reports arrive, and one report dated an hour ahead
holds its row for the membership TTL at most, after which the replica's newer reports (older by its
stepped-back clock) are taken."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from placement_worker import store
from placement_worker.config import PlacementSettings
from placement_worker.consumer import PlacementWorker
from placement_worker.membership import members
from schemas.events import ReplicaState, ReplicaStatus

pytestmark = pytest.mark.integration

TTL_S = 1.5


def _state(replica_id: str, status: ReplicaStatus, skew_s: float) -> ReplicaState:
    at = datetime.now(UTC) + timedelta(seconds=skew_s)
    return ReplicaState(replica_id=replica_id, url=f"http://{replica_id}", status=status, occurred_at=at)


async def _members(pool: asyncpg.Pool, prefix: str) -> set[str]:
    return set(members(await store.heartbeats(pool, prefix), time.time(), TTL_S))


async def test_skewed_replica_clocks_neither_hide_nor_pin_a_member(pool: asyncpg.Pool) -> None:
    prefix = f"clk{uuid.uuid4().hex[:6]}-"
    behind, ahead = f"{prefix}behind", f"{prefix}ahead"
    worker = PlacementWorker(pool, PlacementSettings(replica_id_prefix=prefix, membership_ttl_s=TTL_S))

    await worker.handle(_state(behind, "ready", -60))  # its clock a minute slow
    await worker.handle(_state(ahead, "ready", 3600))  # its clock an hour fast, stepped back just after
    assert await _members(pool, prefix) == {behind, ahead}

    # the stepped-back replica drains: while the future report is fresh, its reports look older, and wait
    await worker.handle(_state(ahead, "draining", 0))
    assert ahead in await _members(pool, prefix)
    deadline = time.monotonic() + 10 * TTL_S
    while ahead in await _members(pool, prefix):
        assert time.monotonic() < deadline, "a future-dated report kept the replica a member"
        await worker.handle(_state(behind, "ready", -60))
        await worker.handle(_state(ahead, "draining", 0))
        await asyncio.sleep(0.2)
    # the future report went stale within the TTL, and the replica's next report is taken
    await worker.handle(_state(ahead, "draining", 0))
    assert await _members(pool, prefix) == {behind}
    status = await pool.fetchval("SELECT status FROM replicas WHERE replica_id = $1", ahead)
    assert status == "draining"
