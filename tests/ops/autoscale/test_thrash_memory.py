"""The thrash loop in pure logic, window by window, long past the scale-down decision: the stats stream's
signal (stats_stream.signals.decide_replicas, with its hysteresis) drives the local autoscaler's decide(),
and a small model of the fleet says when it thrashes. A replica added for thrashing stays while its adapters
need it, so the thrash does not come back; the same loop with an autoscaler that forgets why it added the
replica thrashes again after each scale-down."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ops.autoscale.decide import Demand, Drain, Limits, Observed, Start, decide
from stats_stream.aggregates import FleetLoad
from stats_stream.config import SignalSettings
from stats_stream.signals import ScaleState, decide_replicas

SLOTS = 2  # GPU slots per replica
WINDOW_S = 60.0
SIGNALS = SignalSettings(window_s=WINDOW_S, min_replicas=1, max_replicas=2, scale_down_windows=5)
LIMITS = Limits(min_replicas=1, max_replicas=2, unmanaged_replicas=1, cooldown_s=0)


@dataclass
class Fleet:
    """The stack's replica-0 plus the autoscaler's replicas; each action completes by the next window."""

    ours: list[Observed] = field(default_factory=list)
    state: ScaleState = field(default_factory=ScaleState)
    thrashed: list[int] = field(default_factory=list)  # the windows in which a replica thrashed
    desired: list[int] = field(default_factory=list)  # the signal's answer per window
    sizes: list[int] = field(default_factory=list)  # replicas serving per window

    @property
    def serving(self) -> int:
        return 1 + len(self.ours)

    def window(self, n: int, active_adapters: int, remember: bool) -> None:
        """One window: the fleet serves, the stats stream closes the window, the autoscaler acts."""
        # affinity gives every adapter a home: with fewer slots than active adapters a replica evicts
        # what the next request needs
        thrashing = 1 if active_adapters > self.serving * SLOTS else 0
        if thrashing:
            self.thrashed.append(n)
        load = FleetLoad(
            serving_replicas=self.serving, billed_replicas=self.serving, queue_depth=0, tokens_in_flight=0
        )
        decision = decide_replicas(load, self.state, SIGNALS, thrashing)
        self.state = decision.state
        self.desired.append(decision.desired)
        demand = Demand(decision.desired, thrashing, math.ceil(active_adapters / SLOTS))
        action = decide(self.ours, demand, n * WINDOW_S, None, LIMITS).action
        if isinstance(action, Start):
            self.ours.append(
                Observed(
                    action.index,
                    100 + action.index,
                    n * WINDOW_S,
                    "ready",
                    was_ready=True,
                    for_thrashing=action.for_thrashing and remember,
                )
            )
        elif isinstance(action, Drain):
            self.ours = [r for r in self.ours if r.index != action.index]
        self.sizes.append(self.serving)


def run(active: list[int], remember: bool) -> Fleet:
    fleet = Fleet()
    for n, adapters in enumerate(active):
        fleet.window(n, adapters, remember)
    return fleet


def test_a_replica_added_for_thrashing_stays_while_its_adapters_need_it_and_the_thrash_stays_gone() -> None:
    # four adapters in use all along: one replica's two slots thrash, two replicas' four do not
    fleet = run([4] * 40, remember=True)
    assert fleet.thrashed == [0]  # once, before the second replica joined
    assert fleet.sizes[1:] == [2] * 39
    # the scale-down decision was reached (the signal fell back to one replica after five quiet windows)
    # and did not remove the replica the adapters need
    assert 1 in fleet.desired[1:]


def test_once_the_adapters_no_longer_need_it_the_replica_goes_and_nothing_thrashes() -> None:
    fleet = run([4] * 10 + [2] * 10, remember=True)
    assert fleet.thrashed == [0]
    assert fleet.sizes[-1] == 1  # two adapters fit one replica's slots: it was drained


def test_an_autoscaler_that_forgets_why_it_added_the_replica_thrashes_again_and_again() -> None:
    fleet = run([4] * 40, remember=False)
    assert len(fleet.thrashed) >= 4  # the cycle: thrash, add, five quiet windows, drain, thrash
    assert 1 in fleet.sizes[1:]


def test_the_memory_does_not_pin_a_replica_added_for_load() -> None:
    fleet = Fleet()
    fleet.ours = [Observed(1, 101, 0.0, "ready", was_ready=True, for_thrashing=False)]
    for n in range(20):
        fleet.window(n, 4, remember=True)
    # added for load, it goes when the signal falls; the set then thrashes once, and the replica the
    # thrash brings back is kept
    assert fleet.thrashed == [5]
    assert [r.for_thrashing for r in fleet.ours] == [True] and fleet.sizes[-1] == 2
