"""The one reader of a replica's generate stream, under both the SSE and the JSON chat response.

Each NDJSON line is parsed once, by the contract's own TypeAdapter, straight from its bytes. The reader
yields every token line and every choice's done line, and records them on the request (first-token time,
token count, usage: the prompt once and every choice's completion tokens, so the rate limit's refund and
the tenant's billed usage count all n choices). Any other ending raises the GatewayError the client gets,
in OpenAI's error shape: the replica's own error line, a line that is not a generate event or names a
choice the request has not (502), a stream that stops before its last done line (503 replica_lost, retry)
or a replica silent past the stall deadline (504 upstream_timeout). A lost or silent replica is reported
failed, so the router stops choosing it until it reports again.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator

import httpx
from pydantic import ValidationError

from gateway.errors import BadGateway, GatewayError, GatewayTimeout, ServiceUnavailable
from gateway.public.online import RequestRecord
from gateway.public.upstream.replica_client import UpstreamStalled, UpstreamStream
from schemas.openai import PromptTokensDetails, Usage
from schemas.replica_api import STREAM_EVENT, DoneEvent, ErrorEvent, TokenEvent

log = logging.getLogger(__name__)


def replica_lost() -> GatewayError:
    return ServiceUnavailable(
        "replica_lost", "the replica stopped before the completion finished", None, {"Retry-After": "1"}
    )


def upstream_timeout() -> GatewayError:
    return GatewayTimeout(
        "upstream_timeout",
        "the replica stopped answering before the completion finished",
        None,
        {"Retry-After": "1"},
    )


def total_usage(dones: list[DoneEvent]) -> Usage:
    """A request's usage from its choices' done events: the prompt (and its cached part) once, as choice 0
    reported it, and the sum of every choice's completion tokens."""
    first = min(dones, key=lambda d: d.index).usage
    completion = sum(d.usage.completion_tokens for d in dones)
    return Usage(
        prompt_tokens=first.prompt_tokens,
        completion_tokens=completion,
        total_tokens=first.prompt_tokens + completion,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=first.prompt_tokens_details.cached_tokens),
    )


async def completion_events(
    upstream: UpstreamStream, rec: RequestRecord, choices: int = 1
) -> AsyncGenerator[TokenEvent | DoneEvent, None]:
    """The stream's token events and the done events of its choices, ending after the last; anything else
    raises (see the module doc)."""
    dones: dict[int, DoneEvent] = {}
    try:
        async for line in upstream.lines():
            try:
                event = STREAM_EVENT.validate_json(line)
            except ValidationError as exc:
                log.warning(
                    "request %s: replica %s sent a %d-byte line outside the generate contract (%s)",
                    rec.request_id,
                    rec.replica_id,
                    len(line),
                    exc.errors(include_url=False, include_input=False)[0]["msg"],
                )
                raise BadGateway(
                    "bad_replica_response", "the replica sent a malformed generate event"
                ) from exc
            if not isinstance(event, ErrorEvent) and event.index >= choices:
                raise BadGateway(
                    "bad_replica_response", f"the replica sent choice {event.index} of {choices}"
                )
            if isinstance(event, TokenEvent):
                rec.token_seen()
                yield event
            elif isinstance(event, DoneEvent):
                dones[event.index] = event
                if len(dones) == choices:
                    rec.usage = total_usage(list(dones.values()))
                yield event
                if len(dones) == choices:
                    return
            else:
                err = event.error
                raise ServiceUnavailable(err.code or "generation_failed", err.message or "generation failed")
    except UpstreamStalled as exc:
        log.warning("request %s: replica %s stalled mid-stream: %s", rec.request_id, rec.replica_id, exc)
        upstream.on_failure(upstream.replica.replica_id)
        raise upstream_timeout() from exc
    except httpx.HTTPError as exc:
        log.warning("request %s: replica %s lost mid-stream: %r", rec.request_id, rec.replica_id, exc)
        upstream.on_failure(upstream.replica.replica_id)
        raise replica_lost() from exc
    upstream.on_failure(upstream.replica.replica_id)
    raise replica_lost()
