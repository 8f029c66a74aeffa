"""Tumbling event-time windows: which window an event belongs to, and when a window may close.

Times are integer milliseconds since the epoch. A window [start, start + size) closes once the stream's
event time has passed its end by the grace period; when no events arrive for `idle_close_ms` of wall
clock, the wall clock stands in for event time so a quiet fleet still gets its last window closed.
Event time is capped at the wall clock, so one producer with a fast clock cannot close windows early.
No window closes, by event time or by the wall clock, while the clock is unarmed, that is while input is
left unread: the backlog waiting after a start or a rebalance is read from many partitions at once and in
no order, so an event of a later window read on one partition says nothing of an open window's events
still unread on another; and a quiet stream with a backlog behind it is not a quiet fleet.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime


def to_ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def from_ms(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def window_start(event_ms: int, size_ms: int) -> int:
    """The start of the tumbling window that holds event_ms."""
    return event_ms - event_ms % size_ms


@dataclass
class WindowClock:
    """Tracks event time and quiet periods; says which open windows are due to close."""

    size_ms: int
    grace_ms: int
    idle_close_ms: int
    max_event_ms: int | None = None
    last_event_wall_ms: int | None = None
    armed: bool = False

    def observe(self, event_ms: int, wall_ms: int) -> None:
        """Record an event's time (capped at the wall clock) and when it arrived."""
        capped = min(event_ms, wall_ms)
        self.max_event_ms = capped if self.max_event_ms is None else max(self.max_event_ms, capped)
        self.last_event_wall_ms = wall_ms

    def arm(self, wall_ms: int) -> None:
        """The input is read up to its end: the idle timer runs from this moment, not from process start."""
        if not self.armed:
            self.armed = True
            self.last_event_wall_ms = max(wall_ms, self.last_event_wall_ms or wall_ms)

    def disarm(self) -> None:
        """Input is unread: no window closes until the clock is armed again."""
        self.armed = False

    def horizon(self, wall_ms: int) -> int | None:
        """Windows ending at or before this time may close; None before any time is known or while unarmed."""
        if not self.armed:
            return None
        candidates = [] if self.max_event_ms is None else [self.max_event_ms]
        last = self.last_event_wall_ms
        if last is not None and wall_ms - last >= self.idle_close_ms:
            candidates.append(wall_ms)
        return max(candidates) - self.grace_ms if candidates else None

    def due(self, open_windows: Iterable[int], wall_ms: int) -> list[int]:
        """The open windows whose end is behind the horizon, oldest first."""
        horizon = self.horizon(wall_ms)
        if horizon is None:
            return []
        return sorted(w for w in set(open_windows) if w + self.size_ms <= horizon)


def is_late(window_ms: int, closed_through_ms: int | None) -> bool:
    """An event whose window already closed (or is older) cannot be counted any more."""
    return closed_through_ms is not None and window_ms <= closed_through_ms
