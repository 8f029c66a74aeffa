"""Spill placements, pure: where the router's spills left copies of an adapter, and which have gone idle.

Design (docs/routing.md gives the router's side only: when both owners are overloaded
it sends the request to the least-loaded replica, which then loads the adapter like any miss). The placement
worker does not place spills itself: owners already grow with the adapter's own traffic (k, from
adapter.stats), and a spill is a per-request decision taken on load the worker does not see. It records the
copies the spills leave, so the placements table says where every adapter actually lives:
- a replica's replica.state lists the adapters it holds in GPU, RAM and disk; each one it does not own
  (no owner row), that is ready and not retired, has a `spill` row at the fastest tier listed (created at
  the state's time), and the row goes when a newer state no longer lists it (the replica's LRU evicted it);
- requests.completed names the replica that served each request: a request served where the adapter has a
  placement sets that placement's last_used_at (owners too; greatest wins, so replays change nothing);
- a spill copy unused for spill_idle_s is unloaded (replica.commands `unload`, the replica drains running
  requests first) and its row deleted: the copy's RAM and disk go back to the replica's own adapters and
  the router, which treats replicas holding an adapter as candidates, returns that traffic to the owners;
- a replica that leaves the fleet loses its spill rows (no command: it is gone); a replica that becomes an
  owner turns its spill row into the owner row; a retired version's spill copies are unloaded with its owners.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from schemas.events import ResidentTier

TIER_ORDER: tuple[ResidentTier, ...] = ("gpu", "ram", "disk")  # fastest first


@dataclass(frozen=True)
class SpillRow:
    adapter_id: str
    replica_id: str
    tier: ResidentTier
    last_used_at: datetime


def resident_tiers(gpu: Iterable[str], ram: Iterable[str], disk: Iterable[str]) -> dict[str, ResidentTier]:
    """adapter_id -> the fastest tier a replica reports it in."""
    out: dict[str, ResidentTier] = {}
    for tier, ids in reversed(list(zip(TIER_ORDER, (gpu, ram, disk), strict=True))):
        out.update(dict.fromkeys(ids, tier))
    return out


def idle(rows: Iterable[SpillRow], now: datetime, idle_s: float) -> list[SpillRow]:
    """The spill copies nobody used for idle_s: to unload."""
    cutoff = now - timedelta(seconds=idle_s)
    return sorted((r for r in rows if r.last_used_at < cutoff), key=lambda r: (r.adapter_id, r.replica_id))
