from __future__ import annotations

from ops.autoscale.decide import Drain, Kill, Observed
from ops.autoscale.merged_decide import MergedLimits, MergedObserved, MergedStart, decide_merged

LIMITS = MergedLimits(max_replicas=2, start_timeout_s=100, drain_grace_s=5)
NOW = 1_000.0


def ready(adapter_id: str, index: int, pid: int = 0) -> MergedObserved:
    return MergedObserved(adapter_id, Observed(index, pid or 100 + index, NOW - 50, "ready", True))


def test_a_promoted_adapter_gets_a_merged_replica_at_the_lowest_free_index() -> None:
    decision = decide_merged([ready("a", 0)], {"a": 1, "b": 1}, NOW, LIMITS)
    assert decision.action == MergedStart(1, "b")
    assert decide_merged([], {"a": 0}, NOW, LIMITS).action is None


def test_a_demoted_or_forgotten_adapters_replica_is_drained_before_any_start() -> None:
    fleet = [ready("a", 0), ready("old", 1)]
    assert decide_merged(fleet, {"a": 1, "new": 1}, NOW, LIMITS).action == Drain(1, 101)
    assert decide_merged(fleet, {"a": 1, "old": 0}, NOW, LIMITS).action == Drain(1, 101)


def test_one_action_in_flight_and_never_past_the_limit() -> None:
    starting = MergedObserved("b", Observed(1, 101, NOW - 10, "warming"))
    assert decide_merged([ready("a", 0), starting], {"a": 0, "b": 1}, NOW, LIMITS).action is None
    draining = MergedObserved("a", Observed(0, 100, NOW - 50, "draining", True, NOW + 20))
    assert decide_merged([draining], {"b": 1}, NOW, LIMITS).action is None
    full = decide_merged([ready("a", 0), ready("b", 1)], {"a": 1, "b": 1, "c": 1}, NOW, LIMITS)
    assert full.action is None and "limit" in full.reason


def test_a_start_that_never_turns_ready_and_a_drain_that_overruns_are_killed() -> None:
    stuck = MergedObserved("b", Observed(1, 101, NOW - 101, None))
    assert decide_merged([stuck], {"b": 1}, NOW, LIMITS).action == Kill(1, 101, "start timed out")
    overran = MergedObserved("a", Observed(0, 100, NOW - 500, "draining", True, NOW - 6))
    assert decide_merged([overran], {}, NOW, LIMITS).action == Kill(0, 100, "drain deadline passed")
