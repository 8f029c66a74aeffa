"""Membership under many silent replicas: one death leaves at the TTL; many silent together, even a second
apart, are held for a while (a stall, not deaths), and the held ones that stay silent leave together when the
hold runs out; a replica that said it is draining is never held."""

from __future__ import annotations

from placement_worker.membership import Heartbeat, SilenceGuard

TTL = 10.0
FLEET = [f"r{i}" for i in range(10)]


def _beats(seen: dict[str, float], status: dict[str, str] | None = None) -> list[Heartbeat]:
    status = status or {}
    return [Heartbeat(rid, status.get(rid, "ready"), t) for rid, t in seen.items()]


def _guard(hold_s: float = 30.0) -> SilenceGuard:
    guard = SilenceGuard(max_share=0.34, hold_s=hold_s)
    assert guard.members(_beats(dict.fromkeys(FLEET, 0.0)), 1.0, TTL) == FLEET
    return guard


def _looks(guard: SilenceGuard, last: dict[str, float], start: float, end: float, every: float = 0.1):
    """The guard looked at every `every` seconds from start to end, healthy replicas reporting each second:
    the members at each look. last: the stalled replicas' last reports (the others are fresh)."""
    out, t = [], start
    while t <= end + 1e-9:
        seen = {r: last.get(r, float(int(t))) for r in FLEET}
        out.append(guard.members(_beats(seen), t, TTL))
        t += every
    return out


def test_one_silent_replica_leaves_at_the_ttl() -> None:
    guard = _guard()
    seen = dict.fromkeys(FLEET, 20.0) | {"r3": 0.0}
    assert guard.members(_beats(seen), 20.0, TTL) == [r for r in FLEET if r != "r3"]
    assert guard.held_since is None


def test_a_stall_whose_replicas_fall_silent_a_second_apart_is_held_as_one() -> None:
    """Replicas report on their own one-second schedules, so a stall leaves their last reports spread over a
    second, and each passes the TTL at its own moment; the worker looks ten times a second."""
    guard = _guard()
    last = {f"r{i}": 10.0 + 0.15 * i for i in range(6)}  # 6 of 10 silent, last heard 10.0-10.75 s
    sizes = {len(m) for m in _looks(guard, last, 11.0, 30.0)}
    assert sizes == {10}  # nobody left: the first past the TTL brought the others quiet with it
    assert guard.held == frozenset(last) and guard.held_since is not None


def test_held_replicas_stay_until_the_hold_runs_out_though_some_come_back() -> None:
    guard = _guard()
    silent = {"r1", "r4", "r6", "r8"}  # 40% of the fleet
    last = dict.fromkeys(silent, 0.0)
    assert guard.members(_beats({r: last.get(r, 20.0) for r in FLEET}), 20.0, TTL) == FLEET  # held from 20 s
    last = {"r6": 0.0, "r8": 0.0}  # r1 and r4 report again: two silent, 20% of the fleet
    assert guard.members(_beats({r: last.get(r, 30.0) for r in FLEET}), 30.0, TTL) == FLEET
    assert guard.members(_beats({r: last.get(r, 49.0) for r in FLEET}), 49.0, TTL) == FLEET
    # 30 s held: the two still silent leave together, and are not held again
    after = guard.members(_beats({r: last.get(r, 50.0) for r in FLEET}), 50.0, TTL)
    assert after == sorted(set(FLEET) - {"r6", "r8"}) and guard.held_since is None
    assert guard.members(_beats({r: last.get(r, 51.0) for r in FLEET}), 51.0, TTL) == after


def test_a_hold_ends_when_every_held_replica_reports_again() -> None:
    guard = _guard()
    silent = {f"r{i}" for i in range(6)}
    assert guard.members(_beats({r: (0.0 if r in silent else 15.0) for r in FLEET}), 15.0, TTL) == FLEET
    assert guard.members(_beats(dict.fromkeys(FLEET, 18.0)), 18.0, TTL) == FLEET
    assert guard.held_since is None and guard.accepted == frozenset(FLEET)
    # a later silence of as many is held from its own start
    assert guard.members(_beats({r: (18.0 if r in silent else 40.0) for r in FLEET}), 40.0, TTL) == FLEET
    assert guard.held_since == 40.0


def test_a_held_replica_that_says_it_drains_leaves_at_once() -> None:
    guard = _guard()
    silent = {"r1", "r4", "r6", "r8"}
    guard.members(_beats({r: (0.0 if r in silent else 20.0) for r in FLEET}), 20.0, TTL)
    seen = {r: (0.0 if r in silent - {"r4"} else 22.0) for r in FLEET}
    assert guard.members(_beats(seen, {"r4": "draining"}), 22.0, TTL) == [r for r in FLEET if r != "r4"]
    assert guard.held_since == 20.0  # the others still held


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
    guard = _guard(hold_s=0.0)
    seen = dict.fromkeys(FLEET[:5], 0.0) | dict.fromkeys(FLEET[5:], 20.0)
    assert guard.members(_beats(seen), 20.0, TTL) == FLEET[5:]
