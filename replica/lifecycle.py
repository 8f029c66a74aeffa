"""A replica's life, pure: starting -> warming -> ready -> draining, and the two decisions inside it.

warming: the replica owns adapters (the placement worker plans for it) but is never routed to. It turns
ready once the placement worker has counted it in (so every adapter placed on it is known) and it holds
each of them in its placement's tier or a faster one, or when the warming timeout passes.
draining: no new requests; the process exits once none run and no adapter is placed on it any more, or at
the deadline, when the requests still running are ended with an error line.
A drain may start from any state and is started once: a repeated drain keeps the first deadline.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from schemas.events import ReplicaStatus, ResidentTier, Tier

_SPEED: dict[Tier, int] = {"gpu": 0, "ram": 1, "disk": 2, "remote": 3}

WarmingVerdict = Literal["wait", "ready", "timeout"]
DrainVerdict = Literal["wait", "exit", "expire"]


def is_warm(target: ResidentTier, held: Tier) -> bool:
    """The adapter sits in its placement's tier or a faster one."""
    return _SPEED[held] <= _SPEED[target]


def warm_count(owned: Mapping[str, ResidentTier], held: Mapping[str, Tier]) -> int:
    """How many owned adapters are warm (held maps adapter -> the tier it is in now)."""
    return sum(is_warm(tier, held.get(adapter_id, "remote")) for adapter_id, tier in owned.items())


def warming_verdict(
    planned: bool,
    owned: Mapping[str, ResidentTier],
    held: Mapping[str, Tier],
    elapsed_s: float,
    timeout_s: float,
) -> WarmingVerdict:
    """ready once planned and every owned adapter is warm; timeout past timeout_s; else wait."""
    if planned and warm_count(owned, held) == len(owned):
        return "ready"
    return "timeout" if elapsed_s >= timeout_s else "wait"


def drain_verdict(in_flight: int, placed: int | None, now: float, deadline_at: float) -> DrainVerdict:
    """exit once no request runs and no adapter is placed here (placed None: unknown, so not yet moved);
    expire at the deadline (end what still runs, then exit); else wait."""
    if in_flight == 0 and placed == 0:
        return "exit"
    return "expire" if now >= deadline_at else "wait"


@dataclass
class Lifecycle:
    """The replica's status and what replica.state reports of its warming."""

    status: ReplicaStatus = "starting"
    owned_adapters: int = 0
    warm_adapters: int = 0
    drain_deadline_s: float | None = None  # fixed by the first drain
    drain_deadline_at: float | None = None  # monotonic
    expired: bool = False  # the drain's deadline passed: running requests end with an error line

    def begin_warming(self) -> bool:
        """starting -> warming; False in any other state."""
        if self.status != "starting":
            return False
        self.status = "warming"
        return True

    def progress(self, owned: int, warm: int) -> None:
        self.owned_adapters, self.warm_adapters = owned, warm

    def become_ready(self) -> bool:
        """starting or warming -> ready; False once ready or draining."""
        if self.status not in ("starting", "warming"):
            return False
        self.status = "ready"
        return True

    def drain(self, deadline_s: float, now: float) -> bool:
        """-> draining with this deadline; True only for the first drain (a repeat keeps the first)."""
        if self.status == "draining":
            return False
        self.status = "draining"
        self.drain_deadline_s = deadline_s
        self.drain_deadline_at = now + deadline_s
        return True

    @property
    def accepting(self) -> bool:
        """New generate requests are taken (a warming replica is not routed to, but may be called)."""
        return self.status != "draining"
