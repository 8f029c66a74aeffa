"""Limits every uvicorn listener of the fleet applies to its connections, before any route runs.

- A request's headers must arrive within header_timeout_s of the connection opening, or of the first byte
  after the previous response: a client that sends them a byte at a time (slowloris) is disconnected, so it
  cannot hold a socket for as long as it likes.
- On the public listener, one client address holds at most max_connections_per_client connections; a
  further one is closed as it is accepted. A trusted proxy (uvicorn's forwarded_allow_ips,
  FORWARDED_ALLOW_IPS: an ingress or load balancer that carries many clients' connections) is exempt, and so
  is every caller of an internal listener (the gateways calling replicas): both hold many clients' requests
  on one address.
- The listener as a whole answers at most max_connections connections and requests at once (uvicorn's
  limit_concurrency: past it, 503).

A request body's own deadline is the route's (the public chat route reads its body within one).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from collections import Counter
from typing import Any, ClassVar

from pydantic import BaseModel, Field
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)


class ListenerLimits(BaseModel):
    header_timeout_s: float = Field(default=10.0, gt=0)
    max_connections_per_client: int | None = Field(default=256, ge=1)  # None: no cap (internal listeners)
    max_connections: int = Field(default=10_000, ge=1)


class LimitedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a header deadline and a per-address connection cap."""

    limits: ClassVar[ListenerLimits] = ListenerLimits()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._deadline: asyncio.TimerHandle | None = None
        self._counted: str | None = None
        address = self.client[0] if self.client else ""
        cap = self.limits.max_connections_per_client
        if cap is not None and not _trusted(address, self.config.forwarded_allow_ips):
            per_client = _clients(self.server_state)
            if per_client[address] >= cap:
                log.warning("closing a connection from %s: it holds %d already", address, per_client[address])
                transport.close()
                return
            per_client[address] += 1
            self._counted = address
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._counted is not None:
            per_client = _clients(self.server_state)
            per_client[self._counted] -= 1
            if per_client[self._counted] <= 0:
                del per_client[self._counted]
            self._counted = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._deadline is None and (self.cycle is None or self.cycle.response_complete):
            self._arm()  # the first bytes of the next request on a kept-alive connection
        super().data_received(data)

    def handle_events(self) -> None:
        super().handle_events()
        if self.cycle is not None and not self.cycle.response_complete:
            self._disarm()  # the request's headers are in

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.limits.header_timeout_s, self._headers_too_slow)

    def _disarm(self) -> None:
        deadline = getattr(self, "_deadline", None)  # None too before connection_made
        if deadline is not None:
            deadline.cancel()
            self._deadline = None

    def _headers_too_slow(self) -> None:
        self._deadline = None
        if self.cycle is None or self.cycle.response_complete:
            log.warning(
                "closing a connection from %s: no request headers within %.0f s",
                self.client[0] if self.client else "?",
                self.limits.header_timeout_s,
            )
            self.transport.close()


def _trusted(address: str, proxies: list[str] | str) -> bool:
    """Whether address is one of the trusted proxies: "*", addresses and networks, comma-separated."""
    entries = proxies.split(",") if isinstance(proxies, str) else proxies
    for entry in (e.strip() for e in entries):
        if entry == "*" or entry == address:
            return True
        with contextlib.suppress(ValueError):
            if ipaddress.ip_address(address) in ipaddress.ip_network(entry, strict=False):
                return True
    return False


def _clients(server_state: Any) -> Counter[str]:
    """Connections per client address on one server (kept on its shared state)."""
    counts = getattr(server_state, "lorafleet_clients", None)
    if counts is None:
        counts = Counter()
        server_state.lorafleet_clients = counts
    return counts


def uvicorn_options(limits: ListenerLimits) -> dict[str, Any]:
    """uvicorn.Config keyword arguments that apply limits to a listener (its trusted proxies are the
    Config's forwarded_allow_ips)."""
    protocol = type("LimitedH11", (LimitedH11Protocol,), {"limits": limits})
    return {"http": protocol, "limit_concurrency": limits.max_connections}
