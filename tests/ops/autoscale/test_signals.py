"""The autoscaler follows the newest signal of its own fleet, and none that is too old."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from lorafleet.config import PlatformSettings
from ops.autoscale.signals import SignalFollower
from schemas.events import AutoscaleSignal, Event

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def signal(fleet: str, desired: int, at_s: float, slot_demand: int = 0) -> Event:
    s = AutoscaleSignal(
        fleet=fleet,
        current_replicas=1,
        desired_replicas=desired,
        reason="test",
        occurred_at=T0 + timedelta(seconds=at_s),
        slot_demand=slot_demand,
    )
    return s


def test_the_newest_signal_of_our_fleet_wins_and_others_are_ignored() -> None:
    f = SignalFollower(PlatformSettings(), "ours", max_age_s=60)
    assert f.take(signal("ours", 3, 10)) is not None
    assert f.take(signal("theirs", 9, 20)) is None
    assert f.take(signal("ours", 1, 5)) is None  # older than the one we hold
    assert f.take(None) is None
    assert f.desired(T0.timestamp() + 30) == 3


def test_a_signal_older_than_the_max_age_is_not_acted_on() -> None:
    f = SignalFollower(PlatformSettings(), "ours", max_age_s=60)
    assert f.desired(T0.timestamp()) is None
    f.take(signal("ours", 2, 0))
    assert f.desired(T0.timestamp() + 59) == 2 and f.desired(T0.timestamp() + 61) is None


def test_one_quiet_window_does_not_lower_the_slot_demand_until_the_busy_one_ages_out() -> None:
    """A window that saw fewer adapters (slow requests, a lull) undercounts: the busy window's demand holds
    while its signal is younger than the max age, so a replica a thrash still needs is not drained."""
    f = SignalFollower(PlatformSettings(), "ours", max_age_s=60)
    f.take(signal("ours", 1, 0, slot_demand=2))
    f.take(signal("ours", 1, 30, slot_demand=1))
    demand = f.demand(T0.timestamp() + 31)
    assert demand is not None and (demand.replicas, demand.slot_demand) == (1, 2)
    demand = f.demand(T0.timestamp() + 61)  # the busy window's signal is older than the max age now
    assert demand is not None and demand.slot_demand == 1
    f.take(signal("ours", 1, 100, slot_demand=0))
    assert [s.slot_demand for s in f.recent] == [0]  # the old ones are forgotten as new ones come
