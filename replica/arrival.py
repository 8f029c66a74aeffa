"""Stamp each HTTP request's arrival, before its body is read, so the handler can time what came before it."""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Receive, Scope, Send

ARRIVED = "lorafleet.arrived"  # scope key: time.perf_counter() when the request's headers were parsed


class StampArrival:
    """ASGI middleware: scope[ARRIVED] for every HTTP request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope[ARRIVED] = time.perf_counter()
        await self.app(scope, receive, send)


def arrived(scope: Scope) -> float:
    """The request's arrival mark (now, for a request that did not pass StampArrival)."""
    return float(scope.get(ARRIVED) or time.perf_counter())
