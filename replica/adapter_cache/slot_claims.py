"""Requests waiting for an adapter's slot load, so the load pins the slot for each of them at once.

A slot write keeps its own pin until it lands on the event loop (GpuTier.load with hold=True). There the
cache pins the slot once for every request that was waiting on the adapter, then drops the write's pin:
between the write and the request's pin no other load can evict the slot. Plain state, on the event loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from replica.lora.slots import SlotRef


@dataclass(eq=False)
class Claim:
    """One request's wait for an adapter's slot; ref is set once a load pinned the slot for it."""

    adapter_id: str
    ref: SlotRef | None = None


class SlotClaims:
    """The open claims, by adapter id."""

    def __init__(self) -> None:
        self.open: dict[str, list[Claim]] = {}

    def claim(self, adapter_id: str) -> Claim:
        claim = Claim(adapter_id)
        self.open.setdefault(adapter_id, []).append(claim)
        return claim

    def close(self, claim: Claim) -> None:
        """Stop waiting; the caller owns the pin in claim.ref, if any."""
        claims = self.open.get(claim.adapter_id, [])
        if claim in claims:
            claims.remove(claim)
        if not claims:
            self.open.pop(claim.adapter_id, None)

    def grant(self, adapter_id: str, pin: Callable[[], SlotRef | None]) -> int:
        """Pin the landed slot (pin()) for every open claim on the adapter that has none; how many."""
        granted = 0
        for claim in self.open.get(adapter_id, []):
            if claim.ref is None:
                claim.ref = pin()
                granted += claim.ref is not None
        return granted
