"""When an owner is overloaded: a replica that reports its batch has room while a new request would start
within spill_wait_s, whatever its tokens in flight; one that reports no batch keeps the token threshold."""

from __future__ import annotations

import random
from typing import Any, cast

import pytest

from gateway.config import GatewaySettings
from gateway.public.online import Online
from gateway.public.routing.merged_first import merged_first
from gateway.public.routing.policy import (
    ReplicaLoad,
    RouterPolicy,
    has_room,
    route_affinity,
    route_cost,
    wait_s,
)
from schemas.rendezvous import owners

IDS = [f"r{i}" for i in range(6)]
POLICY = RouterPolicy(spill_wait_s=1.0, prefill_tokens_per_s=8_000.0, row_wait_s=0.4)
ROUTES = {"affinity": route_affinity, "cost": route_cost}


def replica(
    rid: str,
    tokens: int,
    running: int = 0,
    waiting: int = 0,
    prefill: int = 0,
    max_running: int = 32,
    gpu: frozenset[str] = frozenset(),
    merged: str | None = None,
) -> ReplicaLoad:
    return ReplicaLoad(
        rid,
        f"http://{rid}",
        tokens,
        resident=gpu,
        gpu=gpu,
        merged=merged,
        running=running,
        waiting=waiting,
        max_running=max_running,
        prefill_tokens=prefill,
    )


def test_the_wait_is_the_prompts_ahead_plus_a_row_period_per_request_short_of_a_row() -> None:
    assert wait_s(replica("a", 30_000, running=15, prefill=4_000), POLICY) == pytest.approx(0.5)
    # 32 rows taken and 2 waiting: this request is the third without a row
    full = replica("a", 60_000, running=32, waiting=2, prefill=1_000)
    assert wait_s(full, POLICY) == pytest.approx(1_000 / 8_000 + 3 * 0.4)
    # the last free row is this request's
    assert wait_s(replica("a", 60_000, running=31), POLICY) == 0.0
    assert wait_s(replica("a", 60_000, max_running=0), POLICY) is None


def test_a_busy_batch_with_a_free_row_has_room_whatever_its_tokens_in_flight() -> None:
    # 15 running requests of the trace's ~2,000 tokens: far over the token threshold, and a new one starts
    # at the next step
    busy = replica("a", 30_000 + 15 * 2_000, running=15, prefill=1_900)
    assert busy.tokens_in_flight > POLICY.spill_threshold_tokens and has_room(busy, POLICY)
    assert not has_room(replica("a", 0, running=4, prefill=9_000), POLICY)  # 1.1 s of prompts ahead
    assert not has_room(replica("a", 0, running=32, waiting=2), POLICY)  # three row periods
    # a replica that reports no batch (an older one) is judged by its tokens in flight
    assert has_room(replica("a", 32_000, max_running=0), POLICY)
    assert not has_room(replica("a", 32_001, max_running=0), POLICY)


@pytest.mark.parametrize("mode", sorted(ROUTES))
def test_owners_with_free_rows_take_the_request_though_an_idle_replica_waits(mode: str) -> None:
    home, second = owners("x", IDS, 2)
    live = [replica(i, 0) for i in IDS if i not in (home, second)]
    live += [replica(home, 64_000, running=30, prefill=2_000), replica(second, 60_000, running=29)]
    plan = ROUTES[mode]("x", live, POLICY, random.Random(0))
    assert plan.reason == "owner" and plan.replicas[0].replica_id in (home, second)


@pytest.mark.parametrize("mode", sorted(ROUTES))
def test_owners_whose_new_request_would_wait_spill(mode: str) -> None:
    home, second = owners("x", IDS, 2)
    others = [i for i in IDS if i not in (home, second)]
    live = [replica(i, 20_000, running=10) for i in others[1:]] + [replica(others[0], 2_000, running=1)]
    live += [
        replica(home, 80_000, running=32, waiting=4, prefill=8_000),
        replica(second, 70_000, running=30, prefill=12_000),
    ]
    plan = ROUTES[mode]("x", live, POLICY, random.Random(0))
    assert plan.reason == "spill" and plan.replicas[0].replica_id == others[0]
    assert {r.replica_id for r in plan.replicas[1:3]} == {home, second}


def test_an_owner_with_room_goes_first_though_the_other_holds_a_gpu_slot() -> None:
    home, second = owners("x", IDS, 2)
    warm = replica(home, 10_000, running=32, waiting=3, gpu=frozenset({"x"}))
    cold = replica(second, 40_000, running=20, prefill=3_000)
    for route in ROUTES.values():
        assert route("x", [warm, cold], POLICY, random.Random(0)).replicas[0].replica_id == second


def test_affinity_spills_only_to_a_replica_where_the_request_waits_less() -> None:
    home, second = owners("x", IDS, 2)
    other = next(i for i in IDS if i not in (home, second))
    owners_ = [replica(home, 9_000, running=32, waiting=3), replica(second, 9_000, running=32, waiting=3)]
    # fewer tokens in flight, yet a longer queue of prompts: no spill to it
    worse = replica(other, 1_000, running=2, prefill=20_000)
    plan = route_affinity("x", [*owners_, worse], POLICY, random.Random(0))
    assert plan.reason == "owner"
    better = replica(other, 50_000, running=20)
    assert route_affinity("x", [*owners_, better], POLICY, random.Random(0)).reason == "spill"


def test_a_merged_replica_goes_first_while_it_has_room() -> None:
    route = merged_first(route_affinity)
    others = [replica(i, 0) for i in IDS]
    with_room = replica("m", 50_000, running=20, merged="x")
    assert route("x", [with_room, *others], POLICY, random.Random(0)).reason == "merged"
    full = replica("m", 50_000, running=32, waiting=5, merged="x")
    assert route("x", [full, *others], POLICY, random.Random(0)).reason == "merged_overflow"


def test_the_gateway_takes_the_wait_settings() -> None:
    settings = GatewaySettings(spill_wait_s=0.5, prefill_tokens_per_s=4_000.0, row_wait_s=0.2)
    online = Online(settings, *([cast(Any, None)] * 6))
    policy = online.policy
    assert (policy.spill_wait_s, policy.prefill_tokens_per_s, policy.row_wait_s) == (0.5, 4_000.0, 0.2)
