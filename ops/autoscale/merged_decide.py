"""What the merged-replica actuator does next, pure: bring each adapter's merged replicas to its target.

Targets come from merged.targets (adapter_id -> desired merged replicas; a missing adapter wants none).
One action at a time, as for the fleet: a merged replica it started is in flight until it reports ready
(killed past the start timeout), one it drains until its process exits (killed past the drain deadline and
a grace). Otherwise drains go first (an adapter with more serving merged replicas than its target loses
its highest index), then starts (the adapter with the fewest, alphabetically among equals, gets the lowest
free index), within max_replicas merged replicas in all. Only merged replicas it started are ever touched.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ops.autoscale.decide import Decision, Drain, Kill, Observed, Start


@dataclass(frozen=True)
class MergedLimits:
    max_replicas: int = 2  # merged replicas on this machine, over every adapter
    start_timeout_s: float = 300.0
    drain_grace_s: float = 10.0


@dataclass(frozen=True)
class MergedStart(Start):
    adapter_id: str


@dataclass(frozen=True)
class MergedObserved:
    """One merged replica this actuator started: the adapter it serves and what the fleet sees of it."""

    adapter_id: str
    replica: Observed


def decide_merged(
    fleet: list[MergedObserved], targets: Mapping[str, int], now: float, limits: MergedLimits
) -> Decision:
    """The next action (or none, and why) towards the targets."""
    for m in fleet:
        r = m.replica
        if r.drain_deadline is not None and now > r.drain_deadline + limits.drain_grace_s:
            return Decision(Kill(r.index, r.pid, "drain deadline passed"), f"{m.adapter_id}: drain overran")
        if r.starting and now - r.started_at > limits.start_timeout_s:
            return Decision(Kill(r.index, r.pid, "start timed out"), f"{m.adapter_id}: not ready in time")
    busy = [m for m in fleet if m.replica.starting or m.replica.draining]
    if busy:
        return Decision(None, f"in flight: {busy[0].adapter_id} (index {busy[0].replica.index})")
    serving: dict[str, list[Observed]] = {}
    for m in fleet:
        serving.setdefault(m.adapter_id, []).append(m.replica)
    for adapter_id in sorted(serving):
        have = serving[adapter_id]
        if len(have) > targets.get(adapter_id, 0):
            last = max(have, key=lambda r: r.index)
            return Decision(Drain(last.index, last.pid), f"demote {adapter_id}: {len(have)} merged replicas")
    short = sorted(
        (len(serving.get(a, [])), a) for a, want in targets.items() if want > len(serving.get(a, []))
    )
    if not short:
        return Decision(None, "merged replicas at target")
    if len(fleet) >= limits.max_replicas:
        return Decision(None, f"{short[0][1]} wants a merged replica, at the limit of {limits.max_replicas}")
    used = {m.replica.index for m in fleet}
    index = next(i for i in range(len(used) + 1) if i not in used)
    count, adapter_id = short[0]
    return Decision(MergedStart(index, adapter_id), f"promote {adapter_id}: {count} merged replicas")
