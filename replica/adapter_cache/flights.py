"""Singleflight for the cache's promotion steps: one flight per (step, key) runs; later callers join it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, TypeVar

T = TypeVar("T")
FlightKey = tuple[str, str]  # (step, the adapter id or digest it works on)


class Flights:
    """The steps in flight; a flight is listed from its start until its done callback runs."""

    def __init__(self) -> None:
        self.running: dict[FlightKey, asyncio.Future[Any]] = {}

    def __contains__(self, key: object) -> bool:
        return key in self.running

    async def once(self, step: str, key: str, factory: Callable[[], Awaitable[T]]) -> T:
        """Join the step's flight, or start one. A finished flight is never joined: awaiting a done future
        does not yield, so a caller that retries (acquire, when the slot was taken again before it could
        pin) would spin on the loop before the flight's done callback could run."""
        flight_key = (step, key)
        fut = self.running.get(flight_key)
        if fut is None or fut.done():
            fut = asyncio.ensure_future(factory())
            self.running[flight_key] = fut
            fut.add_done_callback(partial(self._land, flight_key))
        return await asyncio.shield(fut)

    def _land(self, flight_key: FlightKey, fut: asyncio.Future[Any]) -> None:
        if self.running.get(flight_key) is fut:  # a later flight of the same step may have replaced it
            del self.running[flight_key]
