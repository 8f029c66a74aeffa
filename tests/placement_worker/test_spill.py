"""Spill bookkeeping, pure: the fastest tier a replica holds each adapter in, and which copies went idle."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from placement_worker.spill import SpillRow, idle, resident_tiers

NOW = datetime(2030, 1, 1, tzinfo=UTC)


def test_each_adapter_is_listed_at_the_fastest_tier_the_replica_reports() -> None:
    held = resident_tiers(gpu=["a"], ram=["a", "b"], disk=["a", "b", "c"])
    assert held == {"a": "gpu", "b": "ram", "c": "disk"}
    assert resident_tiers([], [], []) == {}


def test_only_copies_unused_for_longer_than_the_idle_time_expire() -> None:
    rows = [
        SpillRow("x", "r2", "gpu", NOW - timedelta(seconds=30)),
        SpillRow("a", "r1", "ram", NOW - timedelta(seconds=700)),
        SpillRow("b", "r1", "disk", NOW - timedelta(seconds=600)),  # exactly at the limit: kept
    ]
    assert idle(rows, NOW, 600) == [rows[1]]
    assert idle(rows, NOW, 10) == sorted(rows, key=lambda r: (r.adapter_id, r.replica_id))
