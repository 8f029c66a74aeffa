"""The local autoscaler's decisions: start the lowest free replicas, stop only our highest, respect limits."""

from __future__ import annotations

from lorafleet.autoscale.decide import Limits, Start, Stop, decide

LIMITS = Limits(min_replicas=2, max_replicas=5, unmanaged_replicas=2, first_port=18100)


def test_scaling_up_starts_new_replicas_after_the_stack_ones_on_consecutive_ports() -> None:
    assert decide({}, 4, LIMITS) == [Start(2, "replica-2", 18102), Start(3, "replica-3", 18103)]


def test_scaling_up_fills_the_lowest_free_index_first() -> None:
    assert decide({3: 333}, 4, LIMITS) == [Start(2, "replica-2", 18102)]


def test_desired_above_the_maximum_is_clamped() -> None:
    assert [a.index for a in decide({}, 50, LIMITS)] == [2, 3, 4]


def test_scaling_down_stops_the_highest_numbered_replica_we_started_by_pid() -> None:
    assert decide({2: 222, 3: 333, 4: 444}, 4, LIMITS) == [Stop(4, "replica-4", 444)]


def test_scaling_down_never_goes_below_the_minimum_nor_stops_replicas_we_did_not_start() -> None:
    assert decide({2: 222}, 0, LIMITS) == [Stop(2, "replica-2", 222)]
    assert decide({}, 0, LIMITS) == []  # replica-0 and replica-1 are not ours
    high_min = Limits(min_replicas=3, max_replicas=5)
    assert decide({2: 222, 3: 333}, 1, high_min) == [Stop(3, "replica-3", 333)]


def test_a_fleet_at_the_desired_size_is_left_alone() -> None:
    assert decide({2: 222}, 3, LIMITS) == []
