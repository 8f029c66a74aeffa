"""Streaming client to the replica service: open a generate stream on the first replica that answers.

A connection failure before any byte (refused, reset, timed out connecting) moves to the next replica of
the route plan, once; the failed replica is reported so the router stops choosing it. A replica that
answers with an error status is not retried when the request itself is at fault (4xx other than "adapter
not here"); a replica that cannot take it (503, adapter missing there) passes it on like a failure.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from gateway.routing import ReplicaLoad

log = logging.getLogger(__name__)

# Codes with which a replica says "not me", so the next one may serve it.
_PASS_ON = {"adapter_not_found", "adapter_not_served", "no_free_slot", "wrong_replica"}


class ReplicaUnavailable(Exception):
    """No replica of the plan could take the request."""


class ReplicaRejected(Exception):
    """A replica refused the request itself (bad parameters, prompt too long): relay its error."""

    def __init__(self, status: int, error: dict[str, Any]) -> None:
        super().__init__(error.get("message", "replica refused the request"))
        self.status = status
        self.error = error


@dataclass
class UpstreamStream:
    """An open NDJSON generate stream on one replica."""

    replica: ReplicaLoad
    response: httpx.Response
    retried: bool

    @property
    def adapter_tier(self) -> str | None:
        return self.response.headers.get("x-adapter-tier")

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        async for line in self.response.aiter_lines():
            if line:
                yield json.loads(line)

    async def aclose(self) -> None:
        await self.response.aclose()


class ReplicaClient:
    """One pooled httpx client for every replica."""

    def __init__(
        self, service_token: str, connect_timeout_s: float = 2.0, read_timeout_s: float = 60.0
    ) -> None:
        self.http = httpx.AsyncClient(
            headers={"Authorization": f"Bearer {service_token}"},
            timeout=httpx.Timeout(read_timeout_s, connect=connect_timeout_s),
            limits=httpx.Limits(max_connections=2000, max_keepalive_connections=200),
        )

    async def aclose(self) -> None:
        await self.http.aclose()

    async def open(
        self,
        plan: Sequence[ReplicaLoad],
        body: dict[str, Any],
        on_failure: Callable[[str], None],
        max_attempts: int = 2,
    ) -> UpstreamStream:
        """Open the stream on plan[0], or on the next replica after a connection failure (once)."""
        attempts = 0
        for replica in plan:
            if attempts >= max_attempts:
                break
            attempts += 1
            url = f"{replica.url.rstrip('/')}/internal/replicas/{replica.replica_id}/generate"
            request = self.http.build_request("POST", url, json=body)
            try:
                response = await self.http.send(request, stream=True)
            except (
                httpx.ConnectError,
                httpx.ConnectTimeout,
                httpx.RemoteProtocolError,
                httpx.ReadError,
            ) as exc:
                log.warning("replica %s unreachable before the first byte: %r", replica.replica_id, exc)
                on_failure(replica.replica_id)
                continue
            if response.status_code == 200:
                return UpstreamStream(replica, response, retried=attempts > 1)
            error = await _error_of(response)
            if response.status_code >= 500 or error.get("code") in _PASS_ON:
                log.warning(
                    "replica %s cannot take it: %s %s", replica.replica_id, response.status_code, error
                )
                continue
            raise ReplicaRejected(response.status_code, error)
        raise ReplicaUnavailable("no replica could take the request")


async def _error_of(response: httpx.Response) -> dict[str, Any]:
    try:
        await response.aread()
        error = response.json().get("error")
    except (ValueError, AttributeError, httpx.HTTPError):
        error = None
    finally:
        await response.aclose()
    return error if isinstance(error, dict) else {"message": f"replica answered {response.status_code}"}
