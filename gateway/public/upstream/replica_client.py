"""Streaming client to the replica service: open a generate stream on the first replica that answers.

A stream counts as open once its first event line has arrived, within first_token_s of sending the request
(connecting included). A replica that fails before that is given up on and the next replica of the route
plan is tried, once: nothing has reached the client yet. It is also reported failed, so the router stops
choosing it, unless it did answer (the response head came, only the first token did not): that replica is
busy, not hung. On the last replica to try, one that has answered keeps the request until its first line or
the read timeout: a request queued on a loaded fleet waits rather than fails. A replica that answers with an
error status is not retried when the request itself is at fault (4xx other than "adapter not here"); a
replica that cannot take it (503, adapter missing there) passes it on like a failure. Once open, a stream
whose replica sends nothing for stall_s raises UpstreamStalled. When every pooled connection is in use, the
request is refused at once as this gateway's overload (pool_exhausted), and no replica is reported failed.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import get_args

import httpx
from pydantic import ValidationError

from gateway.public.routing.policy import ReplicaLoad
from schemas.api import ErrorBody, ErrorDetail
from schemas.events import Tier
from schemas.replica_api import GenerateRequest

log = logging.getLogger(__name__)

# Codes with which a replica says "not me", so the next one may serve it.
_PASS_ON = {"adapter_not_found", "adapter_not_served", "no_free_slot", "wrong_replica"}
_JSON = {"Content-Type": "application/json"}
_TIERS: dict[str, Tier] = {tier: tier for tier in get_args(Tier)}


class ReplicaUnavailable(Exception):
    """No replica of the plan could take the request; timed_out when the last one tried sent no first
    event within the first-token deadline."""

    def __init__(
        self,
        message: str,
        timed_out: bool = False,
        refusal: Refusal | None = None,
        pool_exhausted: bool = False,
    ) -> None:
        super().__init__(message)
        self.timed_out = timed_out
        self.refusal = refusal  # the last replica's own 5xx answer, when it refused rather than failed
        self.pool_exhausted = pool_exhausted  # this gateway had no free connection: its load, no replica's


@dataclass(frozen=True)
class Refusal:
    """A replica's error answer: its status, error object and Retry-After (seconds, as it sent them)."""

    status: int
    error: ErrorDetail
    retry_after: str | None


class UpstreamStalled(Exception):
    """An open stream's replica sent nothing within the stall deadline."""


class _NoFirstLine(Exception):
    """The body ended before its first event line."""


class ReplicaRejected(Exception):
    """A replica refused the request itself (bad parameters, prompt too long): relay its error."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.error.message)
        self.status = refusal.status
        self.error = refusal.error
        self.retry_after = refusal.retry_after


@dataclass
class UpstreamStream:
    """An open NDJSON generate stream on one replica; on_failure reports the replica as failed."""

    replica: ReplicaLoad
    response: httpx.Response
    retried: bool
    stall_s: float = math.inf
    on_failure: Callable[[str], None] = field(default=lambda _replica_id: None)
    _chunks: AsyncIterator[bytes] | None = field(default=None, init=False, repr=False)
    _lines: list[bytes] = field(default_factory=list, init=False, repr=False)
    _rest: bytes = field(default=b"", init=False, repr=False)
    _ended: bool = field(default=False, init=False, repr=False)

    @property
    def adapter_tier(self) -> Tier | None:
        """The tier the replica found the adapter in (x-adapter-tier); None when absent or unknown."""
        return _TIERS.get(self.response.headers.get("x-adapter-tier", ""))

    async def _fill(self, deadline_s: float) -> None:
        """Read chunks until a whole line is buffered or the body ends; UpstreamStalled past deadline_s
        without a byte."""
        if self._chunks is None:
            self._chunks = self.response.aiter_bytes()
        while not self._lines and not self._ended:
            try:
                async with asyncio.timeout(None if math.isinf(deadline_s) else deadline_s):
                    chunk = await anext(self._chunks)
            except StopAsyncIteration:
                self._ended = True
                if self._rest:
                    self._lines.append(self._rest)
                return
            except TimeoutError as exc:
                raise UpstreamStalled(
                    f"no byte from replica {self.replica.replica_id} in {deadline_s} s"
                ) from exc
            *lines, self._rest = (self._rest + chunk).split(b"\n")
            self._lines.extend(line for line in lines if line)

    async def prefetch(self) -> None:
        """Buffer the first event line (the caller bounds the wait); _NoFirstLine when the body has none."""
        await self._fill(math.inf)
        if not self._lines:
            raise _NoFirstLine(f"replica {self.replica.replica_id} ended the stream before its first line")

    async def lines(self) -> AsyncIterator[bytes]:
        """The NDJSON body's non-empty lines, as raw bytes without their newline; UpstreamStalled when the
        replica is silent for stall_s."""
        while True:
            await self._fill(self.stall_s)
            if not self._lines:
                return
            yield self._lines.pop(0)

    async def aclose(self) -> None:
        await self.response.aclose()


class ReplicaClient:
    """One pooled httpx client for every replica."""

    def __init__(
        self,
        service_token: str,
        connect_timeout_s: float = 2.0,
        read_timeout_s: float = 60.0,
        max_connections: int = 2000,
        pool_timeout_s: float = 1.0,
    ) -> None:
        self.http = httpx.AsyncClient(
            headers={"Authorization": f"Bearer {service_token}"},
            timeout=httpx.Timeout(read_timeout_s, connect=connect_timeout_s, pool=pool_timeout_s),
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=min(200, max_connections)
            ),
        )

    async def aclose(self) -> None:
        await self.http.aclose()

    async def open(
        self,
        plan: Sequence[ReplicaLoad],
        body: GenerateRequest,
        on_failure: Callable[[str], None],
        max_attempts: int = 2,
        first_token_s: float = math.inf,
        stall_s: float = math.inf,
    ) -> UpstreamStream:
        """Open the stream on plan[0], or on the next replica after a failure before its first line (once)."""
        content = body.model_dump_json(exclude_none=True)
        timed_out, refusal = False, None
        last = min(len(plan), max_attempts)
        for attempt, replica in enumerate(plan[:max_attempts], start=1):
            url = f"{replica.url.rstrip('/')}/internal/replicas/{replica.replica_id}/generate"
            request = self.http.build_request("POST", url, content=content, headers=_JSON)
            response: httpx.Response | None = None
            try:
                async with asyncio.timeout(None if math.isinf(first_token_s) else first_token_s):
                    response = await self.http.send(request, stream=True)
                    if response.status_code != 200:
                        refusal = await self._refused(replica, response)
                        timed_out = False
                        continue
                    upstream = UpstreamStream(replica, response, attempt > 1, stall_s, on_failure)
                    if attempt < last:
                        await upstream.prefetch()
                if attempt == last:
                    # The last replica to try has answered: it is busy (its queue), not hung. Its first line
                    # gets what the read timeout allows, so a loaded fleet queues the request, not fails it.
                    await upstream.prefetch()
                return upstream
            except httpx.PoolTimeout as exc:
                # every connection of this gateway's pool is in use: its own load, not the replica's fault,
                # and the next replica would wait on the same pool
                log.warning("no free connection to replicas: %r", exc)
                raise ReplicaUnavailable(
                    "this gateway has no free connection to a replica", pool_exhausted=True
                ) from exc
            except (TimeoutError, httpx.HTTPError, _NoFirstLine) as exc:
                timed_out = isinstance(exc, TimeoutError | httpx.TimeoutException)
                if timed_out and response is not None:
                    # it answered, so it is alive: busy, not hung; the next replica may still be quicker
                    log.warning("replica %s sent no first token in %s s", replica.replica_id, first_token_s)
                else:
                    log.warning("replica %s failed before its first line: %r", replica.replica_id, exc)
                    on_failure(replica.replica_id)
                refusal = None
                if response is not None:
                    await response.aclose()
        raise ReplicaUnavailable("no replica could take the request", timed_out, refusal)

    async def _refused(self, replica: ReplicaLoad, response: httpx.Response) -> Refusal:
        """Return the refusal when the replica cannot take it (the next may); raise ReplicaRejected when
        the request is at fault or over a cap of the tenant's (a 4xx)."""
        wait = response.headers.get("retry-after")
        refusal = Refusal(response.status_code, await _error_of(response), wait)
        if refusal.status >= 500 or refusal.error.code in _PASS_ON:
            log.warning("replica %s cannot take it: %s %s", replica.replica_id, refusal.status, refusal.error)
            return refusal
        raise ReplicaRejected(refusal)


async def _error_of(response: httpx.Response) -> ErrorDetail:
    """The replica's error object, or one that says what status came without one."""
    try:
        return ErrorBody.model_validate_json(await response.aread()).error
    except (ValidationError, httpx.HTTPError):
        return ErrorDetail(message=f"replica answered {response.status_code}", type="server_error")
    finally:
        await response.aclose()
