"""The replica's lifecycle, pure: the status machine, when warming is done and what a drain decides."""

from __future__ import annotations

from replica.lifecycle import Lifecycle, drain_verdict, is_warm, warm_count, warming_verdict


def test_a_replica_warms_then_turns_ready_once_and_a_drain_is_final() -> None:
    life = Lifecycle()
    assert life.status == "starting" and life.accepting
    assert life.begin_warming() and life.status == "warming"
    assert not life.begin_warming()
    life.progress(3, 1)
    assert (life.owned_adapters, life.warm_adapters) == (3, 1)
    assert life.become_ready() and life.status == "ready" and not life.become_ready()
    assert life.drain(30.0, now=100.0) and life.status == "draining" and not life.accepting
    assert not life.drain(5.0, now=101.0)  # a repeat keeps the first deadline
    assert (life.drain_deadline_s, life.drain_deadline_at) == (30.0, 130.0)
    assert not life.become_ready() and not life.begin_warming()


def test_a_drain_while_warming_never_turns_ready() -> None:
    life = Lifecycle()
    life.begin_warming()
    assert life.drain(10.0, now=0.0)
    assert not life.become_ready() and life.status == "draining"


def test_warm_means_the_placement_tier_or_a_faster_one() -> None:
    assert is_warm("ram", "ram") and is_warm("ram", "gpu") and is_warm("disk", "ram")
    assert not is_warm("gpu", "ram") and not is_warm("ram", "disk") and not is_warm("ram", "remote")
    owned = {"a": "gpu", "b": "ram", "c": "ram"}
    assert warm_count(owned, {"a": "gpu", "b": "disk"}) == 1  # c not held at all


def test_warming_is_done_once_planned_and_every_owned_adapter_is_warm_or_at_the_timeout() -> None:
    owned = {"a": "ram", "b": "gpu"}
    warm = {"a": "ram", "b": "gpu"}
    assert warming_verdict(True, owned, warm, 1.0, 60.0) == "ready"
    assert warming_verdict(False, owned, warm, 1.0, 60.0) == "wait"  # more may be placed on it yet
    assert warming_verdict(True, owned, {"a": "ram", "b": "ram"}, 1.0, 60.0) == "wait"
    assert warming_verdict(True, {}, {}, 0.0, 60.0) == "ready"  # planned, owns nothing
    assert warming_verdict(False, {}, {}, 60.0, 60.0) == "timeout"
    assert warming_verdict(True, owned, {}, 61.0, 60.0) == "timeout"


def test_a_drain_exits_when_idle_and_moved_and_expires_at_its_deadline() -> None:
    assert drain_verdict(0, 0, now=1.0, deadline_at=30.0) == "exit"
    assert drain_verdict(2, 0, now=1.0, deadline_at=30.0) == "wait"  # requests still run
    assert drain_verdict(0, 3, now=1.0, deadline_at=30.0) == "wait"  # placements not moved yet
    assert drain_verdict(0, None, now=1.0, deadline_at=30.0) == "wait"  # placements unknown
    assert drain_verdict(2, 0, now=30.0, deadline_at=30.0) == "expire"
    assert drain_verdict(0, 3, now=31.0, deadline_at=30.0) == "expire"
    assert drain_verdict(0, 0, now=31.0, deadline_at=30.0) == "exit"
