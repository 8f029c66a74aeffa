"""Replicas that share one machine's compute, as on the local stack where every replica runs on the same
CPU cores (a GPU fleet gives each replica its own device and needs none of this).

Processor sharing: the steps in progress split the machine evenly, so a step whose solo duration is w
finishes after w seconds of 1/n of the machine, n being the steps running at each moment. Whenever a step
starts or ends, every running step's remaining work is brought up to date and its end re-timed; the STEP
events carry a version so a superseded end is ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Schedule = Callable[[float, int, object], None]


class SharedHost:
    def __init__(self, schedule: Schedule, step_kind: int) -> None:
        self.schedule, self.step_kind = schedule, step_kind
        self.active: dict[Any, list[float]] = {}  # replica -> [remaining solo seconds, version]
        self.last = 0.0

    def _advance(self, now: float) -> None:
        if self.active:
            done = (now - self.last) / len(self.active)
            for state in self.active.values():
                state[0] -= done
        self.last = now

    def _retime(self, now: float) -> None:
        n = len(self.active)
        for replica, state in self.active.items():
            state[1] += 1
            self.schedule(now + max(state[0], 0.0) * n, self.step_kind, (replica, state[1]))

    def start(self, replica: Any, work_s: float, now: float) -> None:
        """A replica starts a step that takes work_s seconds with the machine to itself."""
        self._advance(now)
        self.active[replica] = [work_s, 0.0]
        self._retime(now)

    def end(self, replica: Any, version: float, now: float) -> bool:
        """A STEP event fired: True when it is the step's current end (the step is done)."""
        state = self.active.get(replica)
        if state is None or state[1] != version:
            return False
        self._advance(now)
        del self.active[replica]
        self._retime(now)
        return True
