"""What the simulator measures to explain a GPU hit rate: each replica's active set per window against its
slots, adapters held in GPU slots on two or more replicas at once, and whether each GPU miss was a miss
of the fleet (no replica held the adapter in a slot) or of the routing (another replica held it).

A replica's active set in a window is the distinct adapters routed to it then; when it outgrows the
slots, LRU must evict adapters that come back in the same window. A second GPU copy of one adapter is a
slot some other adapter could have used: copies made by a router that splits a cold adapter's traffic
between its owners show up as misses of the routing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sim.replica import SimReplica, SimRequest


@dataclass
class FleetProbe:
    """Samples the fleet once per window and classifies each GPU miss as it is routed."""

    replicas: Mapping[str, SimReplica]
    window_s: float = 60.0
    warmup_s: float = 0.0
    next_window: float = 0.0
    routed: dict[str, set[str]] = field(default_factory=dict)  # replica -> adapters routed this window
    served: dict[str, set[str]] = field(default_factory=dict)  # replica -> adapters routed after warmup
    active: list[int] = field(default_factory=list)  # one per replica and window after warmup
    copies: list[tuple[int, int, int]] = field(default_factory=list)  # (adapters on 2+, extra copies, slots)
    misses: Counter[str] = field(default_factory=Counter)  # fleet | routing, of measured requests

    def __post_init__(self) -> None:
        self.next_window = self.window_s

    def on_route(self, sr: SimRequest, replica_id: str) -> None:
        """A request goes to replica_id: note its adapter, and whose miss it is if it misses the GPU."""
        aid = sr.req.adapter_id
        self.routed.setdefault(replica_id, set()).add(aid)
        target = self.replicas[replica_id]
        hit = target.slots.lookup(aid) is not None and aid not in target.loading
        if sr.req.arrival_s < self.warmup_s:
            return
        self.served.setdefault(replica_id, set()).add(aid)
        if hit:
            return
        elsewhere = any(
            r.slots.lookup(aid) is not None and aid not in r.loading
            for rid, r in self.replicas.items()
            if rid != replica_id
        )
        self.misses["routing" if elsewhere else "fleet"] += 1

    def tick(self, now: float) -> None:
        """Close the window if it ended by now (a window that saw no routing is not a sample)."""
        if now < self.next_window:
            return
        if self.next_window > self.warmup_s and self.routed:
            self.active += [len(self.routed.get(rid, ())) for rid in self.replicas]
            held: Counter[str] = Counter()
            for r in self.replicas.values():
                held.update(r.slots.adapter_ids())
            shared = [n for n in held.values() if n > 1]
            self.copies.append((len(shared), sum(n - 1 for n in shared), sum(held.values())))
        self.routed = {}
        self.next_window += self.window_s * (1 + (now - self.next_window) // self.window_s)

    def summary(self, measured: int, gpu_slots: int) -> dict[str, Any]:
        active = sorted(self.active)
        n = max(len(self.copies), 1)
        slots_used = sum(c[2] for c in self.copies)
        served = [len(self.served.get(rid, ())) for rid in self.replicas]
        return {
            "window_s": self.window_s,
            # over the whole measured run: the set an LRU of gpu_slots would have to hold
            "adapters_served_per_replica": {
                "mean": round(sum(served) / len(served), 1) if served else None,
                "max": max(served, default=None),
            },
            "gpu_slots": gpu_slots,
            "active_adapters_per_window": {
                "mean": round(sum(active) / len(active), 1) if active else None,
                "p95": active[min(len(active) - 1, int(0.95 * len(active)))] if active else None,
                "max": active[-1] if active else None,
                "share_over_slots": round(sum(a > gpu_slots for a in active) / len(active), 4)
                if active
                else None,
            },
            "gpu_copies": {
                "adapters_on_2_or_more_replicas": round(sum(c[0] for c in self.copies) / n, 1),
                "extra_copies_share_of_used_slots": round(sum(c[1] for c in self.copies) / slots_used, 4)
                if slots_used
                else None,
            },
            "gpu_miss_share": {
                # of measured requests: no replica held the adapter in a slot / another replica did
                "fleet": round(self.misses["fleet"] / max(measured, 1), 5),
                "routing": round(self.misses["routing"] / max(measured, 1), 5),
            },
        }
