from __future__ import annotations

from datetime import UTC, datetime, timedelta

from lorafleet.config import PlatformSettings
from ops.autoscale.merged_targets import TargetFollower
from schemas.events import Event, MergedTarget

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def target(adapter_id: str, desired: int, t: float, fleet: str = "replica-") -> Event:
    at = T0 + timedelta(seconds=t)
    reason = "promote" if desired else "demote"
    event = MergedTarget(
        occurred_at=at, adapter_id=adapter_id, desired_replicas=desired, reason=reason, fleet=fleet
    )
    return event


def test_the_newest_target_of_our_fleet_wins_and_nothing_is_known_before_the_first_read() -> None:
    follower = TargetFollower(PlatformSettings(), "replica-")
    for raw in (
        target("a", 1, 1),
        target("a", 0, 3),
        target("a", 1, 2),  # older than the demotion: ignored
        target("b", 1, 1),
        target("c", 1, 1, fleet="other-"),  # another stack's on the same Kafka
        None,  # a record that did not decode
    ):
        follower.take(raw)
    assert follower.targets() is None
    follower.caught_up = True
    assert follower.targets() == {"a": 0, "b": 1}
