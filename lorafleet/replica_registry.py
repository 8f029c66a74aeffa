"""Where the fleet's replicas registered themselves (replica_registrations): which replica.state to believe.

The public gateway sends a replica its service token and tenants' prompts, so it routes only to an
address a replica wrote over its authenticated database connection, under its identity key; the placement
worker gives adapters only to such replicas. A replica.state whose (replica_id, url) does not match a row
is dropped by both, and so is one not signed with the state key registered for its id
(lorafleet/state_signature.py): anyone able to produce to the topic, the other replicas included, can
neither point the router anywhere nor speak for another replica. The rows are cached, re-read every
refresh_s and soon after a miss, so a replica that just registered is believed within about min_refresh_s.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Literal

import asyncpg

from lorafleet.state_signature import header, verify
from schemas.events import ReplicaState

log = logging.getLogger(__name__)

Verdict = Literal["registered", "unregistered", "url_mismatch", "bad_signature"]


class ReplicaRegistry:
    """replica_id -> registered url and state key, for the replicas whose id starts with prefix."""

    def __init__(
        self, pool: asyncpg.Pool, prefix: str = "", refresh_s: float = 2.0, min_refresh_s: float = 0.5
    ) -> None:
        self.pool = pool
        self.prefix = prefix
        self.refresh_s = refresh_s
        self.min_refresh_s = min_refresh_s
        self._urls: dict[str, str] = {}
        self._keys: dict[str, str | None] = {}
        self._missed = asyncio.Event()

    def check(self, replica_id: str, url: str, value: bytes, signature: bytes | None) -> Verdict:
        """Whether this (replica_id, url) is registered and the state's value bytes carry that replica's
        signature; a miss asks for an early refresh (a replica may have registered again since)."""
        registered = self._urls.get(replica_id)
        if registered == url and verify(self._keys.get(replica_id), value, signature):
            return "registered"
        self._missed.set()
        if registered is None:
            return "unregistered"
        return "url_mismatch" if registered != url else "bad_signature"

    def believes(
        self,
        state: ReplicaState,
        value: bytes,
        headers: object,
        rejected: Callable[[ReplicaState, str], None] | None = None,
    ) -> bool:
        """check() on one record (its value bytes and Kafka headers): True for its registered replica's own
        state; otherwise False, after rejected(state, verdict)."""
        verdict = self.check(state.replica_id, state.url, value, header(headers))
        if verdict == "registered":
            return True
        if rejected is not None:
            rejected(state, verdict)
        return False

    async def refresh(self) -> None:
        rows = await self.pool.fetch(
            "SELECT replica_id, url, state_key FROM replica_registrations WHERE starts_with(replica_id, $1)",
            self.prefix,
            timeout=10,
        )
        self._urls = {r["replica_id"]: r["url"] for r in rows}
        self._keys = {r["replica_id"]: r["state_key"] for r in rows}

    async def run(self) -> None:
        """Refresh every refresh_s, or min_refresh_s after a miss; a failed read keeps the last rows."""
        while True:
            try:
                await asyncio.wait_for(self._missed.wait(), self.refresh_s)
            except TimeoutError:
                pass
            self._missed.clear()
            try:
                await self.refresh()
            except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
                log.warning("could not re-read replica_registrations (%r); keeping the last rows", exc)
            await asyncio.sleep(self.min_refresh_s)


class StateRejections:
    """Counts and logs the replica.state messages a process drops (once per id, address and reason)."""

    def __init__(self, count: Callable[[str], None]) -> None:
        self.count = count
        self._logged: set[tuple[str, str, str]] = set()

    def __call__(self, state: ReplicaState, verdict: str) -> None:
        self.count(verdict)
        key = (state.replica_id, state.url, verdict)
        if key not in self._logged and len(self._logged) < 10_000:
            self._logged.add(key)
            log.warning(
                "ignoring replica.state of %r at %r: %s (not a registered replica's signed state)",
                state.replica_id[:100],
                state.url[:200],
                verdict,
            )
