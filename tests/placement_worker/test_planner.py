"""The pure planner: owner counts grow with traffic, tiers follow traffic, and diffs touch only what moved."""

from __future__ import annotations

from placement_worker.membership import Heartbeat, members
from placement_worker.planner import Change, Policy, desired, diff, owner_count, tier_for
from schemas.rendezvous import owners

POLICY = Policy(default_owners=2, replica_capacity_tokens_per_s=640.0, gpu_tokens_per_s=1.0)
FLEET = [f"r{i}" for i in range(8)]


def test_owner_count_is_default_raised_by_traffic_and_capped_by_fleet() -> None:
    assert owner_count(0, 26, POLICY) == 2
    assert owner_count(500, 26, POLICY) == 2
    assert owner_count(2000, 26, POLICY) == 4  # the brief: 2,000 tokens/s needs at least 4 replicas at 640
    assert owner_count(1e6, 5, POLICY) == 5
    assert owner_count(0, 1, POLICY) == 1
    assert owner_count(0, 0, POLICY) == 0


def test_steady_traffic_goes_to_gpu_idle_stays_in_ram() -> None:
    assert tier_for(0.0, POLICY) == "ram" and tier_for(5.0, POLICY) == "gpu"


def test_desired_uses_the_shared_rendezvous_owners() -> None:
    plan = desired({"a": 0.0, "hot": 2000.0}, FLEET, POLICY)
    assert set(plan["a"]) == set(owners("a", FLEET, 2)) and set(plan["a"].values()) == {"ram"}
    assert set(plan["hot"]) == set(owners("hot", FLEET, 4)) and set(plan["hot"].values()) == {"gpu"}


def test_diff_loads_gains_unloads_losses_and_ignores_what_stays() -> None:
    current = {"a": {"r0": "ram", "r1": "ram"}, "b": {"r2": "ram", "r3": "ram"}}
    target = {"a": {"r0": "ram", "r4": "ram"}, "b": {"r2": "gpu", "r3": "ram"}}
    assert diff(current, target) == [
        Change("a", "r4", "load", "ram"),
        Change("a", "r1", "unload", "ram"),
        Change("b", "r2", "load", "gpu"),
    ]
    assert diff(target, target) == []


def test_a_joining_replica_only_gains_placements() -> None:
    demand = {f"adapter-{i}": 0.0 for i in range(600)}
    before = desired(demand, FLEET, POLICY)
    after = desired(demand, [*FLEET, "r-new"], POLICY)
    changes = diff(before, after)
    loads = [c for c in changes if c.command == "load"]
    unloads = [c for c in changes if c.command == "unload"]
    assert {c.replica_id for c in loads} == {"r-new"}
    assert len(loads) == len(unloads)
    expected = 2 * len(demand) / (len(FLEET) + 1)
    assert 0.7 * expected < len(loads) < 1.3 * expected


def test_members_are_ready_recent_and_in_the_fleet() -> None:
    beats = [
        Heartbeat("r0", "ready", 100.0),
        Heartbeat("r1", "ready", 80.0),  # too old
        Heartbeat("r2", "draining", 100.0),
        Heartbeat("other-r3", "ready", 100.0),
        Heartbeat("r4", "starting", 100.0),
    ]
    assert members(beats, now=105.0, ttl_s=10.0, prefix="r") == ["r0"]


def test_a_retired_version_is_unloaded_from_all_its_owners() -> None:
    current = desired({"v1": 0.0, "v2": 0.0}, FLEET, POLICY)
    target = desired({"v1": 0.0, "v2": 0.0}, FLEET, POLICY, retired=frozenset({"v1"}))
    assert target["v1"] == {} and target["v2"] == current["v2"]
    assert diff(current, target) == [Change("v1", r, "unload", "ram") for r in sorted(current["v1"])]


def test_rolling_back_to_a_retired_version_loads_it_again_on_the_same_owners() -> None:
    retired = desired({"v1": 0.0}, FLEET, POLICY, retired=frozenset({"v1"}))
    back = desired({"v1": 0.0}, FLEET, POLICY)
    assert diff(retired, back) == [Change("v1", r, "load", "ram") for r in sorted(owners("v1", FLEET, 2))]


def test_replanning_a_retired_version_again_changes_nothing() -> None:
    target = desired({"v1": 0.0}, FLEET, POLICY, retired=frozenset({"v1"}))
    assert diff(target, target) == [] and diff({}, target) == []
