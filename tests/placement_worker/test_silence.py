"""Membership under many silent replicas: one death leaves at once, many silent together are held for a
while (a stall, not deaths), and a replica that said it is draining is never held."""

from __future__ import annotations

from placement_worker.membership import Heartbeat, SilenceGuard

TTL = 10.0
FLEET = [f"r{i}" for i in range(10)]


def _beats(seen: dict[str, float], status: dict[str, str] | None = None) -> list[Heartbeat]:
    status = status or {}
    return [Heartbeat(rid, status.get(rid, "ready"), t) for rid, t in seen.items()]


def _guard() -> SilenceGuard:
    guard = SilenceGuard(max_share=0.34, hold_s=30.0)
    assert guard.members(_beats(dict.fromkeys(FLEET, 0.0)), 1.0, TTL) == FLEET
    return guard


def test_one_silent_replica_leaves_at_once() -> None:
    guard = _guard()
    seen = dict.fromkeys(FLEET, 20.0) | {"r3": 0.0}
    assert guard.members(_beats(seen), 20.0, TTL) == [r for r in FLEET if r != "r3"]
    assert guard.held_since is None


def test_many_silent_together_are_held_then_dropped_after_the_hold() -> None:
    guard = _guard()
    silent = {"r1", "r4", "r6", "r8"}  # 40% of the fleet
    seen = {r: (0.0 if r in silent else 20.0) for r in FLEET}
    assert guard.members(_beats(seen), 20.0, TTL) == FLEET  # held from 20 s
    seen = {r: (0.0 if r in silent else 45.0) for r in FLEET}
    assert guard.members(_beats(seen), 45.0, TTL) == FLEET
    assert guard.members(_beats(seen | dict.fromkeys(set(FLEET) - silent, 50.0)), 50.0, TTL) == sorted(
        set(FLEET) - silent
    )  # 30 s held: the fleet is replanned without them
    assert guard.held_since is None and guard.accepted == frozenset(FLEET) - silent


def test_held_replicas_that_report_again_never_left() -> None:
    guard = _guard()
    silent = {"r0", "r1", "r2", "r3", "r4", "r5"}
    seen = {r: (0.0 if r in silent else 15.0) for r in FLEET}
    assert guard.members(_beats(seen), 15.0, TTL) == FLEET
    assert guard.members(_beats(dict.fromkeys(FLEET, 18.0)), 18.0, TTL) == FLEET
    assert guard.held_since is None and guard.accepted == frozenset(FLEET)
    # a later, separate silence of as many is held from its own start
    seen = {r: (18.0 if r in silent else 40.0) for r in FLEET}
    assert guard.members(_beats(seen), 40.0, TTL) == FLEET
    assert guard.held_since == 40.0


def test_replicas_that_said_they_drain_leave_however_many() -> None:
    guard = _guard()
    draining = {r: "draining" for r in FLEET[:6]}
    assert guard.members(_beats(dict.fromkeys(FLEET, 5.0), draining), 5.0, TTL) == FLEET[6:]
    assert guard.held_since is None


def test_a_small_fleet_holds_two_of_three_but_not_one_of_two() -> None:
    three = SilenceGuard(max_share=0.34, hold_s=30.0)
    three.members(_beats(dict.fromkeys(["a", "b", "c"], 0.0)), 0.0, TTL)
    assert three.members(_beats({"a": 0.0, "b": 0.0, "c": 15.0}), 15.0, TTL) == ["a", "b", "c"]
    two = SilenceGuard(max_share=0.34, hold_s=30.0)
    two.members(_beats(dict.fromkeys(["a", "b"], 0.0)), 0.0, TTL)
    assert two.members(_beats({"a": 0.0, "b": 15.0}), 15.0, TTL) == ["b"]


def test_no_hold_leaves_silent_replicas_at_the_ttl() -> None:
    guard = SilenceGuard(max_share=0.34, hold_s=0.0)
    guard.members(_beats(dict.fromkeys(FLEET, 0.0)), 0.0, TTL)
    assert (
        guard.members(_beats(dict.fromkeys(FLEET[:5], 0.0) | dict.fromkeys(FLEET[5:], 20.0)), 20.0, TTL)
        == (FLEET[5:])
    )
