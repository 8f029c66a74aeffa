"""The gateway's live replica table: newest state wins, stale replicas drop out (by arrival, on the
gateway's clock), other fleets are ignored, and only ready replicas are routed to."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from gateway.public.routing.policy import RouterPolicy, route_affinity, route_random
from gateway.public.routing.replica_view import ReplicaView
from schemas.events import ReplicaState


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def state(replica_id: str, tokens: int = 0, age_s: float = 0.0) -> ReplicaState:
    return ReplicaState(
        replica_id=replica_id,
        url=f"http://127.0.0.1/{replica_id}",
        tokens_in_flight=tokens,
        occurred_at=datetime.now(UTC) - timedelta(seconds=age_s),
    )


def test_a_replicas_batch_is_its_report_plus_the_requests_sent_since_as_waiting() -> None:
    """Between two reports the requests this gateway sent wait for prefill, as far as it knows: each counts
    as a waiting request with its prompt, until the next report says where they are."""
    view = ReplicaView(stale_s=3.0, clock=Clock())
    report = state("replica-0", tokens=30_000).model_copy(
        update={"running": 15, "queue_depth": 1, "max_running": 32, "prefill_tokens": 1_900}
    )
    view.apply(report)
    view.add_inflight("replica-0", 2_500, prompt_tokens=2_000)
    view.add_inflight("replica-0", 1_300, prompt_tokens=1_000)
    [r] = view.live()
    assert (r.running, r.waiting, r.max_running, r.prefill_tokens) == (15, 3, 32, 4_900)
    assert r.tokens_in_flight == 33_800
    view.add_inflight("replica-0", -2_500)  # an end changes nothing the report holds
    assert view.live()[0].waiting == 3
    view.apply(report.model_copy(update={"running": 17, "queue_depth": 0, "prefill_tokens": 0}))
    [r] = view.live()
    assert (r.running, r.waiting, r.prefill_tokens) == (17, 0, 0)


def test_stale_replicas_drop_out_and_an_older_state_never_replaces_a_newer_one() -> None:
    clock = Clock()
    view = ReplicaView(stale_s=3.0, clock=clock)
    view.apply(state("replica-0", tokens=5))
    view.apply(state("replica-1", tokens=1))
    view.apply(state("replica-0", tokens=99, age_s=10))  # a late, older state
    assert sorted(r.replica_id for r in view.live()) == ["replica-0", "replica-1"]
    assert next(r for r in view.live() if r.replica_id == "replica-0").tokens_in_flight == 5
    clock.now += 5
    view.apply(state("replica-1", tokens=2))
    assert [r.replica_id for r in view.live()] == ["replica-1"]


def test_a_replica_whose_clock_is_behind_is_routed_to_while_its_reports_arrive() -> None:
    clock = Clock()
    view = ReplicaView(stale_s=3.0, clock=clock)
    view.apply(state("replica-0", age_s=60))  # sent "a minute ago" by its own clock: it just arrived
    assert [r.replica_id for r in view.live()] == ["replica-0"]
    clock.now += 2
    view.apply(state("replica-0", tokens=7, age_s=59))
    clock.now += 2
    assert [r.tokens_in_flight for r in view.live()] == [7]
    clock.now += 2  # no report for 4 s on this gateway's clock
    assert view.live() == []


def test_a_future_dated_state_holds_a_replica_for_stale_s_at_most() -> None:
    clock = Clock()
    view = ReplicaView(stale_s=3.0, clock=clock)
    view.apply(state("replica-0", tokens=1, age_s=-3600))  # its clock an hour ahead, then stepped back
    for _ in range(5):  # it reports every second; the first reports after the step look older
        clock.now += 1
        view.apply(state("replica-0", tokens=2))
    assert [r.tokens_in_flight for r in view.live()] == [2]  # the newest report, not the future one
    clock.now += 1
    view.apply(state("replica-0", tokens=3))
    assert [r.tokens_in_flight for r in view.live()] == [3]


def test_replicas_of_another_fleet_are_never_routed_to() -> None:
    view = ReplicaView(stale_s=3.0, clock=Clock(), replica_id_prefix="replica-")
    view.apply(state("replica-0"))
    view.apply(state("gwt-a"))
    assert [r.replica_id for r in view.live()] == ["replica-0"]


def test_only_ready_replicas_are_routed_to_never_warming_or_draining_ones() -> None:
    view = ReplicaView(stale_s=3.0, clock=Clock())
    for replica_id, status in (("r-warming", "warming"), ("r-ready", "ready"), ("r-draining", "draining")):
        view.apply(state(replica_id).model_copy(update={"status": status}))
    live = view.live()
    assert [r.replica_id for r in live] == ["r-ready"]
    for route in (route_affinity, route_random):
        plan = route("acme-support-v1", live, RouterPolicy(), random.Random(0))
        assert [r.replica_id for r in plan.replicas] == ["r-ready"]
    view.apply(state("r-warming").model_copy(update={"status": "ready"}))  # it finished warming
    assert sorted(r.replica_id for r in view.live()) == ["r-ready", "r-warming"]


def test_the_router_sees_each_replicas_tiers_and_gpu_slots() -> None:
    view = ReplicaView(stale_s=3.0, clock=Clock())
    body = state("replica-0").model_dump() | {"gpu_adapters": ["a"], "ram_adapters": ["b"], "gpu_slots": 16}
    view.apply(ReplicaState(**body))
    (live,) = view.live()
    assert (live.gpu, live.resident, live.gpu_slots) == (frozenset({"a"}), frozenset({"a", "b"}), 16)


def test_a_feed_outage_holds_every_replica_and_a_working_feed_ages_a_silent_one() -> None:
    """No replica.state from anyone because Kafka is down is not every replica dying: the ages stand still
    until the feed answers again; a replica that stays silent while the feed works drops out as before."""
    clock = Clock()
    view = ReplicaView(stale_s=3.0, clock=clock)
    view.feed.delivered()
    view.apply(state("replica-0"))
    view.apply(state("replica-1"))
    clock.now += 60.0  # the broker is down: no poll delivers, no probe answers
    assert sorted(r.replica_id for r in view.live()) == ["replica-0", "replica-1"]
    assert [round(age, 1) for _, age in view.states()] == [1.0, 1.0]  # up to the allowance, then held
    view.feed.delivered()  # back: replica-1 reports, replica-0 stays silent
    view.apply(state("replica-1"))
    clock.now += 3.5
    view.feed.delivered()
    view.apply(state("replica-1"))
    assert [r.replica_id for r in view.live()] == ["replica-1"]


def test_a_replicas_load_is_its_last_report_plus_what_this_gateway_sent_since() -> None:
    """Two gateways share an owner. Each sees its own requests at once and the other's only through the
    replica's reports: counting its own reservations alone, each would fill the owner to the spill
    threshold by itself."""
    view = ReplicaView(stale_s=3.0, clock=Clock())
    view.apply(state("replica-0", tokens=20_000))  # the other gateway's requests, reported
    view.add_inflight("replica-0", 9_000)
    assert [r.tokens_in_flight for r in view.live()] == [29_000]
    view.apply(state("replica-0", tokens=29_000))  # the next report counts this gateway's request in
    assert next(r for r in view.live() if r.replica_id == "replica-0").tokens_in_flight == 29_000
    view.add_inflight("replica-0", -9_000)  # done; the report still has it until the next one
    view.apply(state("replica-0", tokens=20_000))
    assert next(r for r in view.live() if r.replica_id == "replica-0").tokens_in_flight == 20_000
    view.add_inflight("replica-0", 40_000)  # more than any report: its own reservations are the floor
    view.apply(state("replica-0", tokens=1_000))
    assert next(r for r in view.live() if r.replica_id == "replica-0").tokens_in_flight == 40_000
