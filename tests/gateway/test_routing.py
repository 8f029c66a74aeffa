"""Router policy: rendezvous owners first by load, spill when owners are busy, random mode."""

from __future__ import annotations

import random

from gateway.routing import ReplicaLoad, RouterPolicy, route_affinity, route_random
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
