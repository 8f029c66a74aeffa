from __future__ import annotations

import random

from gateway.public.routing.merged_first import merged_first
from gateway.public.routing.policy import ROUTING_MODES, ReplicaLoad, RouterPolicy
from schemas.rendezvous import owners

POLICY = RouterPolicy(owners_k=2, spill_threshold_tokens=1_000, gpu_preference_tokens=100)
ROUTE = merged_first(ROUTING_MODES["affinity"])


def _fleet(merged_load: int = 0) -> list[ReplicaLoad]:
    plain = [ReplicaLoad(f"r{i}", f"http://r{i}", 10 * i) for i in range(3)]
    return [
        *plain,
        ReplicaLoad("m-a", "http://m-a", merged_load, gpu=frozenset({"a"}), merged="a"),
        ReplicaLoad("m-a2", "http://m-a2", merged_load + 5, gpu=frozenset({"a"}), merged="a"),
        ReplicaLoad("m-b", "http://m-b", 0, gpu=frozenset({"b"}), merged="b"),
    ]


def _ids(adapter_id: str, live: list[ReplicaLoad]) -> tuple[list[str], str]:
    plan = ROUTE(adapter_id, live, POLICY, random.Random(0))
    return [r.replica_id for r in plan.replicas], plan.reason


def test_an_adapters_merged_replicas_go_first_and_the_unmerged_ones_follow_as_overflow() -> None:
    ids, reason = _ids("a", _fleet())
    assert (ids[:2], reason) == (["m-a", "m-a2"], "merged")
    assert sorted(ids[2:]) == ["r0", "r1", "r2"]


def test_a_merged_replica_never_serves_another_adapter() -> None:
    for adapter_id in ("c", "a"):
        ids, _ = _ids(adapter_id, _fleet())
        assert "m-b" not in ids
    ids, reason = _ids("c", _fleet())
    assert sorted(ids) == ["r0", "r1", "r2"] and reason != "merged"


def test_busy_merged_replicas_send_the_request_to_the_unmerged_owners_first() -> None:
    ids, reason = _ids("a", _fleet(merged_load=5_000))
    assert reason == "merged_overflow"
    assert sorted(ids[:3]) == ["r0", "r1", "r2"] and ids[3:] == ["m-a", "m-a2"]


def test_without_a_ready_merged_replica_the_plan_is_the_wrapped_modes() -> None:
    plain = [r for r in _fleet() if r.merged is None]
    wrapped = ROUTING_MODES["affinity"]("a", plain, POLICY, random.Random(0))
    assert ROUTE("a", plain, POLICY, random.Random(0)) == wrapped
    only_merged = [r for r in _fleet(merged_load=5_000) if r.merged == "a"]
    assert _ids("a", only_merged) == (["m-a", "m-a2"], "merged")


def test_a_merged_replica_with_room_goes_first_though_another_merged_one_is_over_the_threshold() -> None:
    live = [r for r in _fleet() if r.replica_id != "m-a2"]
    live.append(ReplicaLoad("m-a2", "http://m-a2", 5_000, gpu=frozenset({"a"}), merged="a"))
    ids, reason = _ids("a", live)
    assert (ids[:2], reason) == (["m-a", "m-a2"], "merged")


def test_the_wrapped_mode_keeps_an_unmerged_owner_with_room_ahead_of_an_overloaded_one() -> None:
    """No merged replica for the adapter: an owner over the threshold holding it in a GPU slot goes after
    the owner with room, in every wrapped mode that spills."""
    ids = ["r0", "r1", "r2", "r3"]
    policy = RouterPolicy(owners_k=2, spill_threshold_tokens=1_000, gpu_preference_tokens=500)
    for mode in ("affinity", "cost"):
        for adapter in ("a", "c", "d", "e"):
            warm, cold = owners(adapter, ids, 2)
            live = [
                ReplicaLoad(
                    i,
                    f"http://{i}",
                    {warm: 1_100, cold: 800}.get(i, 0),
                    frozenset({adapter}) if i in (warm, cold) else frozenset(),
                    frozenset({adapter}) if i == warm else frozenset(),
                )
                for i in ids
            ]
            live.append(ReplicaLoad("m-b", "http://m-b", 0, gpu=frozenset({"b"}), merged="b"))
            plan = merged_first(ROUTING_MODES[mode])(adapter, live, policy, random.Random(0))
            assert plan.reason == "owner", (mode, adapter)
            assert [r.replica_id for r in plan.replicas[:2]] == [cold, warm], (mode, adapter)
