"""Replica generate streams for gateway tests: written by the replica's own serializer, served as httpx
responses cut into chunks of any size (so lines and UTF-8 characters straddle chunk boundaries)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable

import httpx

from gateway.public.online import RequestRecord
from gateway.public.routing.policy import ReplicaLoad
from gateway.public.upstream.replica_client import UpstreamStream
from replica.engine.engine import StepOutput
from replica.stream_events import stream_events
from schemas.replica_api import encode_event

PROMPT_TOKENS = 5


def outputs(texts: list[str], finish_reason: str, last_text: str = "") -> list[StepOutput]:
    """The engine's outputs for one request: a token per text, then the finishing output."""
    out = [StepOutput("r", 100 + i, text, False, None, PROMPT_TOKENS, i + 1) for i, text in enumerate(texts)]
    n = len(texts) + 1
    out.append(StepOutput("r", 100 + n, last_text, True, finish_reason, PROMPT_TOKENS, n))
    return out


def failed(after: list[str]) -> list[StepOutput]:
    """Some tokens, then the engine's failure output."""
    out = outputs(after, "stop")[:-1]
    out.append(StepOutput("r", None, "", True, "error", PROMPT_TOKENS, len(after), "RuntimeError: step"))
    return out


def replica_bytes(steps: Iterable[StepOutput]) -> bytes:
    """What the replica writes for these outputs."""
    return b"".join(encode_event(e) for step in steps for e in stream_events(step))


def upstream(body: bytes, chunk: int = 0) -> UpstreamStream:
    """An open generate stream whose body arrives in chunks of `chunk` bytes (0: all at once)."""

    async def chunks() -> AsyncIterator[bytes]:
        size = chunk or max(1, len(body))
        for i in range(0, len(body), size):
            yield body[i : i + size]

    response = httpx.Response(200, content=chunks())
    return UpstreamStream(ReplicaLoad("r1", "http://r1", 0), response, retried=False)


def record() -> RequestRecord:
    return RequestRecord(request_id="req_test", tenant_id="acme", started=0.0, replica_id="r1")
