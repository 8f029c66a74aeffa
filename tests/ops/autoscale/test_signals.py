"""The autoscaler follows the newest signal of its own fleet, and none that is too old."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from lorafleet.config import PlatformSettings
from ops.autoscale.signals import SignalFollower
from schemas.events import AutoscaleSignal, Event

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def signal(fleet: str, desired: int, at_s: float) -> Event:
    s = AutoscaleSignal(
        fleet=fleet,
        current_replicas=1,
        desired_replicas=desired,
        reason="test",
        occurred_at=T0 + timedelta(seconds=at_s),
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
