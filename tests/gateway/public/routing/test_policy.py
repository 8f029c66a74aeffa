"""Router policy: rendezvous owners first by load, spill when owners are busy; cost, table, random modes."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any, cast

import pytest

from gateway.config import GatewaySettings
from gateway.public.online import Online
from gateway.public.routing.policy import (
    ROUTING_MODES,
    ReplicaLoad,
    RouterPolicy,
    expected_cost_s,
    route_affinity,
    route_cost,
    route_random,
    route_table,
    table_score,
)
from schemas.rendezvous import owners

IDS = [f"r{i}" for i in range(6)]


def fleet(
    load: dict[str, int] | None = None, resident: dict[str, set[str]] | None = None
) -> list[ReplicaLoad]:
    load, resident = load or {}, resident or {}
    return [ReplicaLoad(i, f"http://{i}", load.get(i, 0), frozenset(resident.get(i, set()))) for i in IDS]


def test_first_choice_is_an_owner_by_the_shared_rendezvous_function() -> None:
    for n in range(50):
        adapter = f"adapter-{n}"
        plan = route_affinity(adapter, fleet(), RouterPolicy(owners_k=2), random.Random(0))
        assert plan.reason == "owner" and plan.replicas[0].replica_id in owners(adapter, IDS, 2)


def test_owner_with_fewer_tokens_in_flight_wins_and_the_other_is_next() -> None:
    a, b = owners("x", IDS, 2)
    plan = route_affinity("x", fleet({a: 500, b: 100}), RouterPolicy(), random.Random(0))
    assert [r.replica_id for r in plan.replicas[:2]] == [b, a]


def test_busy_owners_spill_to_the_least_loaded_replica() -> None:
    a, b = owners("x", IDS, 2)
    busy = {i: 3000 for i in IDS} | {a: 9000, b: 8000, "r5" if "r5" not in (a, b) else "r4": 10}
    plan = route_affinity("x", fleet(busy), RouterPolicy(spill_threshold_tokens=4096), random.Random(0))
    assert plan.reason == "spill" and plan.replicas[0].tokens_in_flight == 10
    assert {r.replica_id for r in plan.replicas[1:3]} == {a, b}


def test_no_spill_while_one_owner_is_under_the_threshold() -> None:
    a, b = owners("x", IDS, 2)
    plan = route_affinity(
        "x", fleet({a: 9000, b: 4000}), RouterPolicy(spill_threshold_tokens=4096), random.Random(0)
    )
    assert plan.reason == "owner" and plan.replicas[0].replica_id == b


def test_replica_holding_the_adapter_counts_as_an_owner() -> None:
    a, b = owners("x", IDS, 2)
    extra = next(i for i in IDS if i not in (a, b))
    plan = route_affinity("x", fleet({a: 50, b: 50}, {extra: {"x"}}), RouterPolicy(), random.Random(0))
    assert plan.replicas[0].replica_id == extra


def test_every_live_replica_is_in_the_plan_once_and_empty_fleet_is_empty() -> None:
    plan = route_affinity("x", fleet(), RouterPolicy(), random.Random(0))
    assert sorted(r.replica_id for r in plan.replicas) == IDS
    assert route_affinity("x", [], RouterPolicy(), random.Random(0)).replicas == ()


def test_random_mode_spreads_first_choices_over_the_fleet() -> None:
    rng = random.Random(1)
    firsts = {route_random("x", fleet(), RouterPolicy(), rng).replicas[0].replica_id for _ in range(200)}
    assert firsts == set(IDS)


def _owners_of(adapter: str, ids: list[str]) -> list[str]:
    return list(owners(adapter, ids, 2))


def test_an_owner_with_the_adapter_in_a_gpu_slot_goes_first_unless_much_busier() -> None:
    ids = [f"r{i}" for i in range(6)]
    a, b = _owners_of("x", ids)

    def plan(load_a: int, load_b: int):
        live = [
            ReplicaLoad(
                i,
                f"http://{i}",
                {a: load_a, b: load_b}.get(i, 0),
                gpu=frozenset({"x"}) if i == a else frozenset(),
            )
            for i in ids
        ]
        return route_affinity("x", live, RouterPolicy(gpu_preference_tokens=8000), random.Random(0))

    # b is less busy, but a already holds x in a GPU slot: no second slot on b
    assert plan(3000, 100).replicas[0].replica_id == a
    # a is far busier than b: load balance wins over the warm slot
    assert plan(12000, 100).replicas[0].replica_id == b


def _live(load: dict[str, int], gpu: dict[str, set[str]], resident: dict[str, set[str]] | None = None):
    resident = resident or {}
    return [
        ReplicaLoad(
            i,
            f"http://{i}",
            load.get(i, 0),
            frozenset(resident.get(i, set()) | gpu.get(i, set())),
            frozenset(gpu.get(i, set())),
        )
        for i in IDS
    ]


COST = RouterPolicy(drain_tokens_per_s=1000.0, slot_cost_s=2.0)  # a load's slot: 2,000 tokens of queue


def test_cost_keeps_a_cold_adapter_on_its_home_until_the_home_is_a_slot_busier() -> None:
    home, second = owners("x", IDS, 2)
    in_ram = {home: {"x"}, second: {"x"}}
    # the second owner is 1,500 tokens less busy: still cheaper than a second GPU copy
    plan = route_cost("x", _live({home: 1600, second: 100}, {}, in_ram), COST, random.Random(0))
    assert plan.reason == "owner" and plan.replicas[0].replica_id == home
    # 2,500 tokens less busy: past one slot's price, the second owner loads it
    plan = route_cost("x", _live({home: 2600, second: 100}, {}, in_ram), COST, random.Random(0))
    assert plan.replicas[0].replica_id == second


def test_cost_keeps_an_adapter_where_it_is_in_a_slot_until_a_load_at_home_pays() -> None:
    home, second = owners("x", IDS, 2)
    gpu, in_ram = {second: {"x"}}, {home: {"x"}}
    plan = route_cost("x", _live({home: 0, second: 1900}, gpu, in_ram), COST, random.Random(0))
    assert plan.replicas[0].replica_id == second
    plan = route_cost("x", _live({home: 0, second: 2100}, gpu, in_ram), COST, random.Random(0))
    assert plan.replicas[0].replica_id == home


def test_cost_spreads_a_hot_adapter_over_the_replicas_that_hold_it_in_a_slot() -> None:
    home, second = owners("x", IDS, 2)
    gpu = {home: {"x"}, second: {"x"}}
    plan = route_cost("x", _live({home: 300, second: 200}, gpu), COST, random.Random(0))
    assert [r.replica_id for r in plan.replicas[:2]] == [second, home]
    tied = route_cost("x", _live({home: 200, second: 200}, gpu), COST, random.Random(0))
    assert tied.replicas[0].replica_id == home  # ties in owner order


def test_cost_prices_each_tier_by_its_load_time() -> None:
    policy = RouterPolicy(load_s={"gpu": 0.0, "ram": 0.01, "disk": 0.05, "remote": 0.5})
    r = ReplicaLoad("r", "http://r", 0, frozenset({"ram"}), frozenset({"gpu"}))
    costs = {
        tier: expected_cost_s(tier, r, home=True, owner=True, policy=policy) - policy.slot_cost_s
        for tier in ("ram", "disk")
    }
    assert expected_cost_s("gpu", r, home=False, owner=True, policy=policy) == 0.0
    assert costs == pytest.approx({"ram": 0.01, "disk": 0.05})
    remote = expected_cost_s("other", r, home=False, owner=False, policy=policy)
    assert remote == pytest.approx(0.5 + 2 * policy.slot_cost_s)


def test_cost_spills_past_the_threshold_to_the_cheapest_other_replica() -> None:
    home, second = owners("x", IDS, 2)
    others = [i for i in IDS if i not in (home, second)]
    load = {i: 20_000 for i in IDS} | {home: 40_000, second: 40_000, others[0]: 5_000, others[1]: 5_000}
    plan = route_cost("x", _live(load, {}, {others[1]: {"x"}}), COST, random.Random(0))
    # others[1] holds x in RAM, so it joins the candidates and wins without a spill
    assert plan.reason == "owner" and plan.replicas[0].replica_id == others[1]
    plan = route_cost("x", _live(load, {}), COST, random.Random(0))
    assert plan.reason == "spill" and plan.replicas[0].replica_id == others[0]
    below = route_cost("x", _live(load, {}), replace(COST, spill_threshold_tokens=50_000), random.Random(0))
    assert below.reason == "owner" and below.replicas[0].replica_id == home


def test_cost_plans_every_live_replica_once_and_is_a_routing_mode() -> None:
    plan = route_cost("x", fleet(), RouterPolicy(), random.Random(0))
    assert sorted(r.replica_id for r in plan.replicas) == IDS
    assert route_cost("x", [], RouterPolicy(), random.Random(0)).replicas == ()
    assert ROUTING_MODES["cost"] is route_cost


def test_the_gateway_routes_with_the_configured_mode_and_prices() -> None:
    settings = GatewaySettings(routing_mode="cost", drain_tokens_per_s=1000.0, slot_cost_s=2.0)
    online = Online(settings, *([cast(Any, None)] * 6))
    assert (online.policy.drain_tokens_per_s, online.policy.slot_cost_s) == (1000.0, 2.0)
    home, second = owners("x", IDS, 2)
    live = _live({home: 1600, second: 100}, {}, {home: {"x"}, second: {"x"}})
    # the cold adapter stays home, where affinity would take the less busy owner
    assert online.route("x", live, online.policy, random.Random(0)).replicas[0].replica_id == home
    assert route_affinity("x", live, online.policy, random.Random(0)).replicas[0].replica_id == second


def test_table_scores_slot_then_free_slot_then_ram_plus_the_queue_score() -> None:
    def replica(rid: str, load: int, gpu: set[str], ram: set[str], slots: int) -> ReplicaLoad:
        return ReplicaLoad(rid, f"http://{rid}", load, frozenset(gpu | ram), frozenset(gpu), gpu_slots=slots)

    live = [
        replica("in_gpu", 500, {"x", "y"}, set(), 2),
        replica("free", 500, {"y"}, set(), 2),
        replica("in_ram", 500, {"y", "z"}, {"x"}, 2),
        replica("cold", 1000, {"y", "z"}, set(), 2),
        replica("idle_cold", 0, {"y", "z"}, set(), 2),
    ]
    plan = route_table("x", live, RouterPolicy(), random.Random(0))
    assert plan.reason == "table"
    # at half the top load: 1.0, 0.8, 0.6 plus 0.5; the idle cold replica 0 + 1; the busiest cold one 0
    assert [r.replica_id for r in plan.replicas] == ["in_gpu", "free", "in_ram", "idle_cold", "cold"]
    assert table_score("x", live[0], 0, 1000) == pytest.approx(1.5) and ROUTING_MODES["table"] is route_table


def test_table_breaks_ties_at_random() -> None:
    rng = random.Random(2)
    firsts = {route_table("x", fleet(), RouterPolicy(), rng).replicas[0].replica_id for _ in range(100)}
    assert firsts == set(IDS)


def _warm_busy_owner_and_a_cold_one_with_room(mode: str) -> tuple[str, str, list[ReplicaLoad]]:
    """The brief's threshold: an owner at 33,000 tokens holding x in a GPU slot, the other owner at 26,000
    without it, and every other replica idle."""
    warm, cold = owners("x", IDS, 2)
    if mode == "cost":  # the cold owner is home: a load there pays the slot price once
        cold, warm = warm, cold
    return warm, cold, _live({warm: 33_000, cold: 26_000}, {warm: {"x"}}, {cold: {"x"}})


@pytest.mark.parametrize("mode", ["affinity", "cost"])
def test_an_owner_under_the_threshold_goes_first_though_the_busy_one_holds_a_gpu_slot(mode: str) -> None:
    warm, cold, live = _warm_busy_owner_and_a_cold_one_with_room(mode)
    plan = ROUTING_MODES[mode]("x", live, RouterPolicy(), random.Random(0))
    assert plan.reason == "owner"
    assert [r.replica_id for r in plan.replicas[:2]] == [cold, warm]  # the overloaded owner is next
    assert sorted(r.replica_id for r in plan.replicas) == IDS


@pytest.mark.parametrize("mode", ["affinity", "cost"])
def test_every_owner_over_the_threshold_spills_to_the_least_loaded_replica(mode: str) -> None:
    warm, cold = owners("x", IDS, 2)
    idle = next(i for i in IDS if i not in (warm, cold))
    load = {i: 20_000 for i in IDS} | {warm: 33_000, cold: 32_001, idle: 0}
    plan = ROUTING_MODES[mode]("x", _live(load, {warm: {"x"}}), RouterPolicy(), random.Random(0))
    assert plan.reason == "spill" and plan.replicas[0].replica_id == idle
    assert {r.replica_id for r in plan.replicas[1:3]} == {warm, cold}
    at_threshold = load | {cold: 32_000}  # at the threshold an owner still has room
    plan = ROUTING_MODES[mode]("x", _live(at_threshold, {warm: {"x"}}), RouterPolicy(), random.Random(0))
    assert plan.reason == "owner" and plan.replicas[0].replica_id == cold


def test_among_owners_with_room_the_one_holding_a_gpu_slot_still_goes_first() -> None:
    warm, cold = owners("x", IDS, 2)
    live = _live({warm: 31_000, cold: 26_000}, {warm: {"x"}})
    plan = route_affinity("x", live, RouterPolicy(), random.Random(0))
    assert plan.reason == "owner" and [r.replica_id for r in plan.replicas[:2]] == [warm, cold]
