"""Streaming client to the replica service: open a generate stream on the first replica that answers.

A connection failure before any byte (refused, reset, timed out connecting) moves to the next replica of
the route plan, once; the failed replica is reported so the router stops choosing it. A replica that
answers with an error status is not retried when the request itself is at fault (4xx other than "adapter
not here"); a replica that cannot take it (503, adapter missing there) passes it on like a failure.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import get_args

import httpx
from pydantic import ValidationError

from gateway.routing import ReplicaLoad
from schemas.api import ErrorBody, ErrorDetail
from schemas.events import Tier
from schemas.replica_api import GenerateRequest

log = logging.getLogger(__name__)

# Codes with which a replica says "not me", so the next one may serve it.
_PASS_ON = {"adapter_not_found", "adapter_not_served", "no_free_slot", "wrong_replica"}
_JSON = {"Content-Type": "application/json"}
_TIERS: dict[str, Tier] = {tier: tier for tier in get_args(Tier)}


class ReplicaUnavailable(Exception):
    """No replica of the plan could take the request."""


class ReplicaRejected(Exception):
    """A replica refused the request itself (bad parameters, prompt too long): relay its error."""

    def __init__(self, status: int, error: ErrorDetail) -> None:
        super().__init__(error.message)
        self.status = status
        self.error = error


@dataclass
class UpstreamStream:
    """An open NDJSON generate stream on one replica."""

    replica: ReplicaLoad
    response: httpx.Response
    retried: bool

    @property
    def adapter_tier(self) -> Tier | None:
        """The tier the replica found the adapter in (x-adapter-tier); None when absent or unknown."""
        return _TIERS.get(self.response.headers.get("x-adapter-tier", ""))

    async def lines(self) -> AsyncIterator[bytes]:
        """The NDJSON body's non-empty lines, as raw bytes without their newline."""
        rest = b""
        async for chunk in self.response.aiter_bytes():
            *lines, rest = (rest + chunk).split(b"\n")
            for line in lines:
                if line:
                    yield line
        if rest:
            yield rest

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
        body: GenerateRequest,
        on_failure: Callable[[str], None],
        max_attempts: int = 2,
    ) -> UpstreamStream:
        """Open the stream on plan[0], or on the next replica after a connection failure (once)."""
        attempts = 0
        content = body.model_dump_json(exclude_none=True)
        for replica in plan:
            if attempts >= max_attempts:
                break
            attempts += 1
            url = f"{replica.url.rstrip('/')}/internal/replicas/{replica.replica_id}/generate"
            request = self.http.build_request("POST", url, content=content, headers=_JSON)
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
            if response.status_code >= 500 or error.code in _PASS_ON:
                log.warning(
                    "replica %s cannot take it: %s %s", replica.replica_id, response.status_code, error
                )
                continue
            raise ReplicaRejected(response.status_code, error)
        raise ReplicaUnavailable("no replica could take the request")


async def _error_of(response: httpx.Response) -> ErrorDetail:
    """The replica's error object, or one that says what status came without one."""
    try:
        return ErrorBody.model_validate_json(await response.aread()).error
    except (ValidationError, httpx.HTTPError):
        return ErrorDetail(message=f"replica answered {response.status_code}", type="server_error")
    finally:
        await response.aclose()
