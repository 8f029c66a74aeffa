"""A pause after a failed call to a shared store: while it runs, callers skip the store and use their
fallback instead of each waiting out another failure."""

from __future__ import annotations

import time
from collections.abc import Callable


class Pause:
    """active() from a failure until duration_s after it; each failure restarts the pause. Pure state."""

    def __init__(self, duration_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.duration_s = duration_s
        self.clock = clock
        self._until = 0.0

    def active(self) -> bool:
        return self.clock() < self._until

    def start(self) -> bool:
        """Pause for duration_s from now; True when no pause was running (the first failure of an outage)."""
        now = self.clock()
        first = now >= self._until
        self._until = now + self.duration_s
        return first
