"""What the local autoscaler does next, from the fleet it observes and the latest signal: pure.

The fleet is the replicas this autoscaler did not start (the stack's replica-0 .. replica-(n-1)) plus the
ones it did (index n, n+1, ...). One action at a time:
- a replica it started is in flight until it reports `ready`, and is killed as failed past the start timeout;
- a replica it drains is in flight until its process exits, and is killed past the drain deadline and a grace;
- while anything is in flight, and for the cooldown after the last action, the fleet size is left alone;
- otherwise it starts the lowest free index or drains the highest-index replica it started that serves.
It never acts on a replica it did not start. Hysteresis lives in the signal, which is followed as it is,
with one exception: it remembers why it started each replica, and a replica started while the fleet was
thrashing is not drained while the signal's slot demand (its active adapters over one replica's GPU slots)
says the fleet without it would thrash again. A replica started for load goes first.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from schemas.events import ReplicaStatus


@dataclass(frozen=True)
class Limits:
    """The local fleet's shape and the timings of one action."""

    min_replicas: int = 2
    max_replicas: int = 4
    unmanaged_replicas: int = 2  # index 0 .. n-1, started by `lorafleet services up`
    cooldown_s: float = 60.0  # after an action completes, before the next one
    start_timeout_s: float = 300.0  # a started replica not ready by then is stopped as failed
    drain_grace_s: float = 10.0  # past a drain's deadline, the process is killed after this much more


@dataclass(frozen=True)
class Demand:
    """What the latest signal asks for: a fleet size, and what its window saw of thrashing."""

    replicas: int
    thrashing: int = 0  # replicas over the eviction line
    slot_demand: int = 0  # replicas its active adapters need for a GPU slot each (0: unknown)


@dataclass(frozen=True)
class Observed:
    """One replica this autoscaler started, as its files and its state route show it now."""

    index: int
    pid: int
    started_at: float  # epoch seconds the process was started
    status: ReplicaStatus | None  # from the replica's state route; None when it did not answer
    was_ready: bool = False  # it has been seen ready (recorded, so a slow answer later is not a start)
    drain_deadline: float | None = None  # epoch seconds its drain must end by; None when not draining
    for_thrashing: bool = False  # started while the fleet thrashed (recorded with the start)

    @property
    def draining(self) -> bool:
        return self.drain_deadline is not None or self.status == "draining"

    @property
    def starting(self) -> bool:
        return not self.draining and not self.was_ready and self.status != "ready"

    @property
    def serving(self) -> bool:
        return not self.draining and not self.starting


@dataclass(frozen=True)
class Start:
    index: int
    # the signal that asked for it saw a replica thrashing (keyword-only: subclasses add positional fields)
    for_thrashing: bool = field(default=False, kw_only=True)


@dataclass(frozen=True)
class Drain:
    index: int
    pid: int


@dataclass(frozen=True)
class Kill:
    """Stop a failed action's process: a start that timed out or a drain past its deadline."""

    index: int
    pid: int
    reason: str


Action = Start | Drain | Kill


@dataclass(frozen=True)
class Decision:
    action: Action | None
    reason: str


def target_size(desired: int, limits: Limits) -> int:
    """The signal's desired count within the limits (the replicas we did not start always count)."""
    return max(limits.min_replicas, limits.unmanaged_replicas, min(desired, limits.max_replicas))


def still_needed(replica: Observed, serving: int, demand: Demand) -> bool:
    """A replica started for thrashing whose fleet, one replica smaller, could not hold every active
    adapter in a GPU slot: draining it would bring the thrash back."""
    return replica.for_thrashing and demand.slot_demand >= serving


def decide(
    fleet: list[Observed], demand: Demand | None, now: float, last_action_at: float | None, limits: Limits
) -> Decision:
    """The next action (or none, and why) for our replicas, the latest signal's demand and the clock."""
    for r in fleet:
        if r.drain_deadline is not None and now > r.drain_deadline + limits.drain_grace_s:
            return Decision(Kill(r.index, r.pid, "drain deadline passed"), f"index {r.index}: drain overran")
        if r.starting and now - r.started_at > limits.start_timeout_s:
            return Decision(Kill(r.index, r.pid, "start timed out"), f"index {r.index}: not ready in time")
    busy = [r.index for r in fleet if r.starting or r.draining]
    if busy:
        return Decision(None, f"in flight: index {busy[0]}")
    if demand is None:
        return Decision(None, "no recent signal")
    serving = limits.unmanaged_replicas + sum(r.serving for r in fleet)
    target = target_size(demand.replicas, limits)
    if target == serving:
        return Decision(None, f"at target {target}")
    if last_action_at is not None and now - last_action_at < limits.cooldown_s:
        return Decision(None, f"cooldown of {limits.cooldown_s:.0f}s before {serving} -> {target}")
    if target > serving:
        used = {r.index for r in fleet}
        first = limits.unmanaged_replicas
        index = next(i for i in range(first, first + len(used) + 1) if i not in used)
        why = f" (thrashing: {demand.thrashing} replica(s))" if demand.thrashing else ""
        return Decision(
            Start(index, for_thrashing=demand.thrashing > 0), f"scale up {serving} -> {target}{why}"
        )
    ours = sorted((r for r in fleet if r.serving), key=lambda r: r.index)
    if not ours:
        return Decision(None, f"target {target} below {serving}, but none of them is ours")
    # the highest index first, a replica started for load before one a thrash still needs
    drainable = [r for r in ours if not still_needed(r, serving, demand)]
    if not drainable:
        kept = ", ".join(str(r.index) for r in ours)
        return Decision(
            None,
            f"target {target} below {serving}, but index {kept} was started for thrashing and its adapters "
            f"still need {demand.slot_demand} replicas' GPU slots",
        )
    last = drainable[-1]
    return Decision(Drain(last.index, last.pid), f"scale down {serving} -> {target}")
