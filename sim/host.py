"""Replicas that share one machine's compute, as on the local stack where every replica runs on the same
CPU cores (a GPU fleet gives each replica its own device and needs none of this).

Each step has w seconds of solo work; while n steps run at once each progresses at 1 / slowdown(n), with
slowdown(n) = 1 + (n - 1) * contention: contention 1 is even processor sharing (n steps split the machine),
0 is no interference. A replica alone rarely keeps every core busy, so the local stack measures between
(bench/replica_steps.py: the same batch on two replicas at once against one alone). Whenever a step starts
or ends, every running step's remaining work is brought up to date and its end re-timed; the STEP events
carry a version so a superseded end is ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Schedule = Callable[[float, int, object], None]


class SharedHost:
    def __init__(self, schedule: Schedule, step_kind: int, contention: float = 1.0) -> None:
        self.schedule, self.step_kind, self.contention = schedule, step_kind, contention
        self.active: dict[Any, list[float]] = {}  # replica -> [remaining solo seconds, version]
        self.last = 0.0

    def _advance(self, now: float) -> None:
        if self.active:
            done = (now - self.last) / self.slowdown(len(self.active))
            for state in self.active.values():
                state[0] -= done
        self.last = now

    def slowdown(self, n: int) -> float:
        return 1.0 + (n - 1) * self.contention

    def _retime(self, now: float) -> None:
        factor = self.slowdown(len(self.active))
        for replica, state in self.active.items():
            state[1] += 1
            self.schedule(now + max(state[0], 0.0) * factor, self.step_kind, (replica, state[1]))

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
