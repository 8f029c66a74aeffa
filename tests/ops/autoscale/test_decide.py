"""The local autoscaler's next action: limits, one action in flight, cooldown, timeouts, only its own replicas,
and a replica started for thrashing kept while its adapters need it."""

from __future__ import annotations

from ops.autoscale.decide import Decision, Demand, Drain, Kill, Limits, Observed, Start, decide, target_size

LIMITS = Limits(
    min_replicas=2, max_replicas=5, unmanaged_replicas=2, cooldown_s=30, start_timeout_s=100, drain_grace_s=5
)
NOW = 10_000.0


def ready(index: int, started_at: float = 0.0) -> Observed:
    return Observed(index, 1000 + index, started_at, "ready", was_ready=True)


def act(fleet: list[Observed], desired: int | None, last: float | None = None) -> Decision:
    return decide(fleet, None if desired is None else Demand(desired), NOW, last, LIMITS)


def test_scaling_up_starts_one_replica_at_the_lowest_free_index_after_the_stack_ones() -> None:
    assert act([], 4).action == Start(2)  # one at a time, even when two are wanted
    assert act([ready(3)], 5).action == Start(2)
    assert act([ready(2), ready(3)], 5).action == Start(4)


def test_desired_is_clamped_to_the_limits() -> None:
    assert target_size(50, LIMITS) == 5 and target_size(0, LIMITS) == 2
    assert target_size(1, Limits(min_replicas=3, unmanaged_replicas=2)) == 3
    assert act([ready(2), ready(3), ready(4)], 50).action is None  # at the maximum
    assert act([], 0).action is None  # replica-0 and replica-1 are not ours to drain


def test_a_started_replica_is_in_flight_until_it_reports_ready() -> None:
    for status in (None, "starting", "warming"):
        warming = Observed(2, 1002, NOW - 10, status)
        decision = act([warming], 5)
        assert decision.action is None and decision.reason.startswith("in flight")
    assert act([Observed(2, 1002, NOW - 10, "ready")], 5).action == Start(3)


def test_a_replica_seen_ready_once_is_not_a_start_in_flight_when_its_state_does_not_answer() -> None:
    slow = Observed(2, 1002, NOW - 1000, None, was_ready=True)
    assert act([slow], 3).action is None and act([slow], 3).reason == "at target 3"


def test_a_start_past_its_timeout_is_killed_as_failed() -> None:
    stuck = Observed(2, 1002, NOW - 101, "warming")
    assert act([stuck], 5).action == Kill(2, 1002, "start timed out")
    assert act([Observed(2, 1002, NOW - 99, "warming")], 5).action is None


def test_scaling_down_drains_our_highest_serving_replica_only() -> None:
    assert act([ready(2), ready(3), ready(4)], 3).action == Drain(4, 1004)
    assert act([ready(2)], 0).action == Drain(2, 1002)


def test_a_drain_is_in_flight_until_the_process_exits_and_killed_past_deadline_plus_grace() -> None:
    draining = Observed(3, 1003, 0.0, "draining", was_ready=True, drain_deadline=NOW - 4)
    assert act([ready(2), draining], 2).action is None  # nothing else while it drains
    assert act([ready(2), draining], 5).action is None
    overdue = Observed(3, 1003, 0.0, None, was_ready=True, drain_deadline=NOW - 6)
    assert act([ready(2), overdue], 2).action == Kill(3, 1003, "drain deadline passed")


def test_a_replica_reporting_draining_is_draining_even_without_our_record() -> None:
    assert act([Observed(2, 1002, 0.0, "draining", was_ready=True)], 4).action is None


def test_no_action_within_the_cooldown_after_the_last_one() -> None:
    decision = act([ready(2)], 4, last=NOW - 29)
    assert decision.action is None and decision.reason.startswith("cooldown")
    assert act([ready(2)], 4, last=NOW - 31).action == Start(3)
    assert act([ready(2), ready(3)], 2, last=NOW - 29).action is None
    assert act([ready(2)], 3, last=NOW - 1).reason == "at target 3"  # nothing to do is not cooldown


def test_no_recent_signal_changes_nothing_but_timeouts_still_apply() -> None:
    assert act([ready(2)], None).action is None
    assert act([Observed(2, 1002, NOW - 500, None)], None).action == Kill(2, 1002, "start timed out")


def thrash_added(index: int) -> Observed:
    return Observed(index, 1000 + index, 0.0, "ready", was_ready=True, for_thrashing=True)


def test_a_start_asked_for_by_a_thrashing_fleet_is_recorded_as_such() -> None:
    decision = decide([], Demand(3, thrashing=1, slot_demand=3), NOW, None, LIMITS)
    assert decision.action == Start(2, for_thrashing=True) and "thrashing" in decision.reason
    assert decide([], Demand(3), NOW, None, LIMITS).action == Start(2, for_thrashing=False)


def test_a_replica_added_for_thrashing_stays_while_the_active_adapters_need_its_slots() -> None:
    fleet = [thrash_added(2)]  # serving: the stack's two and this one
    for slot_demand in (3, 4):  # the active adapters fill three replicas' slots or more
        decision = decide(fleet, Demand(2, slot_demand=slot_demand), NOW, None, LIMITS)
        assert decision.action is None and "started for thrashing" in decision.reason
    # once they fit in one replica fewer, it goes like any other
    assert decide(fleet, Demand(2, slot_demand=2), NOW, None, LIMITS).action == Drain(2, 1002)
    assert decide(fleet, Demand(2, slot_demand=0), NOW, None, LIMITS).action == Drain(2, 1002)


def test_a_scale_down_takes_a_replica_added_for_load_before_one_a_thrash_needs() -> None:
    fleet = [thrash_added(2), ready(3)]  # index 3 was started for load
    assert decide(fleet, Demand(2, slot_demand=3), NOW, None, LIMITS).action == Drain(3, 1003)
    assert decide(fleet, Demand(2, slot_demand=4), NOW, None, LIMITS).action == Drain(3, 1003)
    # with the load replica gone, the thrash one stays while 3 replicas' slots are needed
    assert decide([thrash_added(2)], Demand(2, slot_demand=3), NOW, None, LIMITS).action is None
