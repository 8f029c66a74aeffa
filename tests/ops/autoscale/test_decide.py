"""The local autoscaler's next action: limits, one action in flight, cooldown, timeouts, only its own replicas."""

from __future__ import annotations

from ops.autoscale.decide import Decision, Drain, Kill, Limits, Observed, Start, decide, target_size

LIMITS = Limits(
    min_replicas=2, max_replicas=5, unmanaged_replicas=2, cooldown_s=30, start_timeout_s=100, drain_grace_s=5
)
NOW = 10_000.0


def ready(index: int, started_at: float = 0.0) -> Observed:
    return Observed(index, 1000 + index, started_at, "ready", was_ready=True)


def act(fleet: list[Observed], desired: int | None, last: float | None = None) -> Decision:
    return decide(fleet, desired, NOW, last, LIMITS)


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
