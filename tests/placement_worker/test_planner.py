"""The pure planner: owner counts grow with traffic, GPU tiers are a per-replica share of slots for the hottest
adapters, and diffs touch only what moved."""

from __future__ import annotations

from collections import Counter

from placement_worker.membership import Heartbeat, joining, members
from placement_worker.planner import (
    Change,
    Policy,
    desired,
    diff,
    gpu_budget,
    owner_count,
    prewarm_targets,
    resend_owned,
    touches_gpu_share,
)
from schemas.rendezvous import owners

POLICY = Policy(
    default_owners=2, replica_capacity_tokens_per_s=640.0, gpu_tokens_per_s=1.0, gpu_slot_fraction=0.25
)
FLEET = [f"r{i}" for i in range(8)]
SLOTS = dict.fromkeys(FLEET, 16)  # a GPU share of 4 per replica


def test_owner_count_is_default_raised_by_traffic_and_capped_by_fleet() -> None:
    assert owner_count(0, 26, POLICY) == 2
    assert owner_count(500, 26, POLICY) == 2
    assert owner_count(2000, 26, POLICY) == 4  # the brief: 2,000 tokens/s needs at least 4 replicas at 640
    assert owner_count(1e6, 5, POLICY) == 5
    assert owner_count(0, 1, POLICY) == 1
    assert owner_count(0, 0, POLICY) == 0


def test_owner_count_grows_at_once_and_shrinks_with_hysteresis() -> None:
    assert owner_count(2000, 26, POLICY, current=2) == 4  # grows as soon as traffic needs it
    assert owner_count(1800, 26, POLICY, current=4) == 4  # 3 would do at 94% each: keep 4
    assert owner_count(1400, 26, POLICY, current=4) == 3  # 3 at 73% each (under 75%)
    assert owner_count(1300, 26, POLICY, current=3) == 3  # 2 would run at 102%
    assert owner_count(650, 26, POLICY, current=2) == 2  # default floor
    assert owner_count(0, 26, POLICY, current=4) == 2  # traffic gone (aged out): back to the default
    assert owner_count(1400, 2, POLICY, current=4) == 2  # the fleet shrank under it
    # hovering at a boundary does not flap: up once, then held
    ks, k = [], 2
    for tps in [1300, 1250, 1300, 1250, 1300]:
        k = owner_count(tps, 26, POLICY, current=k)
        ks.append(k)
    assert ks == [3, 3, 3, 3, 3]


def test_desired_keeps_the_current_owners_through_hysteresis() -> None:
    before = desired({"hot": 2000.0}, FLEET, POLICY)
    assert len(before["hot"]) == 4
    assert desired({"hot": 1800.0}, FLEET, POLICY, current=before)["hot"].keys() == before["hot"].keys()
    after = desired({"hot": 1400.0}, FLEET, POLICY, current=before)
    assert len(after["hot"]) == 3 and set(after["hot"]) < set(before["hot"])  # drops its lowest-ranked


def _gpu_per_replica(plan: dict[str, dict[str, str]]) -> Counter[str]:
    return Counter(r for tiers in plan.values() for r, tier in tiers.items() if tier == "gpu")


def test_desired_uses_the_shared_rendezvous_owners() -> None:
    plan = desired({"a": 0.0, "hot": 2000.0}, FLEET, POLICY, gpu_slots=SLOTS)
    assert set(plan["a"]) == set(owners("a", FLEET, 2)) and set(plan["a"].values()) == {"ram"}
    assert set(plan["hot"]) == set(owners("hot", FLEET, 4))


def test_one_gpu_copy_per_replica_of_traffic_on_the_first_owners() -> None:
    plan = desired({"warm": 50.0, "hot": 2000.0}, FLEET, POLICY, gpu_slots=SLOTS)
    first = owners("warm", FLEET, 2)
    assert plan["warm"] == {first[0]: "gpu", first[1]: "ram"}  # the router's GPU preference follows it
    hot = owners("hot", FLEET, 4)  # 2,000 tok/s: 4 owners, 4 copies (640 each)
    assert plan["hot"] == dict.fromkeys(hot, "gpu")


def test_gpu_placements_never_exceed_the_share_of_each_replicas_slots() -> None:
    demand = {f"adapter-{i}": 1000.0 / (i + 1) for i in range(400)}
    slots = {r: 8 + 4 * i for i, r in enumerate(FLEET)}  # replicas of different sizes
    plan = desired(demand, FLEET, POLICY, gpu_slots=slots)
    per_replica = _gpu_per_replica(plan)
    for r in FLEET:
        assert per_replica[r] == gpu_budget(slots[r], POLICY)  # full: far more candidates than the share
    assert gpu_budget(250, POLICY) == 62
    assert _gpu_per_replica(desired(demand, FLEET, POLICY)) == Counter()  # no slots reported: none


def test_each_replica_gives_its_share_to_its_hottest_adapters() -> None:
    demand = {f"adapter-{i}": 600.0 / (i + 1) for i in range(400)}  # one GPU copy each
    plan = desired(demand, FLEET, POLICY, gpu_slots=SLOTS)
    for r in FLEET:
        first_here = [a for a in demand if owners(a, FLEET, 2)[0] == r]  # demand is hottest first
        assert {a for a in demand if plan[a].get(r) == "gpu"} == set(first_here[:4])


def test_traffic_below_the_threshold_never_takes_a_slot() -> None:
    plan = desired({"cold": 0.5, "idle": 0.0}, FLEET, POLICY, gpu_slots=SLOTS)
    assert set(plan["cold"].values()) == set(plan["idle"].values()) == {"ram"}


def test_an_adapter_pushed_out_of_a_share_is_demoted_to_ram() -> None:
    r = "r0"
    mine = [f"adapter-{i}" for i in range(2000) if owners(f"adapter-{i}", FLEET, 2)[0] == r][:5]
    demand = {a: 100.0 - i for i, a in enumerate(mine)}  # the first four fill r0's share of 4
    before = desired(demand, FLEET, POLICY, gpu_slots=SLOTS)
    assert [before[a][r] for a in mine] == ["gpu"] * 4 + ["ram"]
    demand[mine[4]] = 500.0  # the fifth heats up
    after = desired(demand, FLEET, POLICY, gpu_slots=SLOTS)
    assert [after[a][r] for a in mine] == ["gpu"] * 3 + ["ram", "gpu"]
    assert diff(before, after) == [Change(mine[3], r, "load", "ram"), Change(mine[4], r, "load", "gpu")]


def test_only_adapters_that_can_move_a_gpu_share_need_the_full_ranking() -> None:
    assert not touches_gpu_share({"a": 0.0, "b": 0.5}, {"a": {"r0": "ram"}}, POLICY)
    assert touches_gpu_share({"a": 5.0}, {}, POLICY)  # may enter a share
    assert touches_gpu_share({"a": 0.0}, {"a": {"r0": "gpu", "r1": "ram"}}, POLICY)  # may leave one


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


def test_members_are_warming_or_ready_recent_and_in_the_fleet() -> None:
    beats = [
        Heartbeat("r0", "ready", 100.0),
        Heartbeat("r1", "ready", 80.0),  # too old
        Heartbeat("r2", "draining", 100.0),  # its adapters move before it exits
        Heartbeat("other-r3", "ready", 100.0),
        Heartbeat("r4", "starting", 100.0),
        Heartbeat("r5", "warming", 100.0),  # owns adapters so it loads them before it is routed to
    ]
    assert members(beats, now=105.0, ttl_s=10.0, prefix="r") == ["r0", "r5"]


def test_a_joining_member_gets_a_load_for_every_adapter_it_owns() -> None:
    beats = [
        Heartbeat("r0", "ready", 100.0),
        Heartbeat("r1", "warming", 100.0, joining=True),
        Heartbeat("r2", "warming", 50.0, joining=True),  # not a member (too old)
    ]
    fleet = members(beats, now=105.0, ttl_s=10.0)
    assert joining(beats, fleet) == ["r1"]
    target = desired({"a": 0.0, "b": 0.0, "c": 0.0}, fleet, POLICY)  # two owners: both own all three
    already = [Change("a", "r1", "load", "ram")]  # the replan's own diff sends this one
    resent = resend_owned(target, ["r1"], already)
    assert resent == [Change("b", "r1", "load", "ram"), Change("c", "r1", "load", "ram")]
    assert resend_owned(target, [], already) == []


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


def test_a_new_alias_prewarms_its_home_and_a_deploy_every_owner() -> None:
    three = owners("a-1", FLEET, 3)
    assert prewarm_targets("a-1", sorted(three), takes_over=False) == three[:1]
    assert prewarm_targets("a-1", sorted(three), takes_over=True) == three
    assert prewarm_targets("a-1", [], takes_over=False) == []


def test_a_bulk_registration_prewarms_each_adapter_once_within_the_slots() -> None:
    """The brief's fleet: 5,000 new aliases over 26 replicas of 250 slots. One copy each fits (every adapter
    stays in a slot); a copy on both owners would need 10,000 slots of 6,500, and each replica would evict
    its earlier prewarms for the last aliases registered."""
    fleet = [f"replica-{i}" for i in range(26)]
    ids = [f"adapter-{i:05d}" for i in range(5000)]
    homes = Counter(r for a in ids for r in prewarm_targets(a, owners(a, fleet, 2), takes_over=False))
    assert sum(homes.values()) == len(ids) and max(homes.values()) <= 250
    both = Counter(r for a in ids for r in prewarm_targets(a, owners(a, fleet, 2), takes_over=True))
    assert max(both.values()) > 250
