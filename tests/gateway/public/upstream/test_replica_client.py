"""ReplicaClient against real sockets: a replica that accepts and says nothing is given up on at the
first-token deadline and the next one serves; one that goes silent mid-stream raises UpstreamStalled."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from gateway.public.admission.rate_limit import retry_after_of
from gateway.public.routing.policy import ReplicaLoad
from gateway.public.upstream.errors import public_error
from gateway.public.upstream.replica_client import (
    ReplicaClient,
    ReplicaRejected,
    ReplicaUnavailable,
    UpstreamStalled,
)
from schemas.api import ErrorBody, ErrorDetail
from schemas.replica_api import GenerateRequest, TokenEvent, encode_event

TOKEN_LINE = encode_event(TokenEvent(token_id=7, text="Hi"))
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\ntransfer-encoding: chunked\r\n\r\n"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await asyncio.sleep(30)  # a stopped process: the connection is accepted, nothing comes back


async def _head_then_silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readuntil(b"\r\n\r\n")
    writer.write(HEAD)  # alive, but its queue holds the request past the deadline
    await writer.drain()
    await asyncio.sleep(30)


async def _one_line_then_silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readuntil(b"\r\n\r\n")
    writer.write(HEAD + _chunk(TOKEN_LINE))
    await writer.drain()
    await asyncio.sleep(30)


async def _head_then_one_line_late(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readuntil(b"\r\n\r\n")
    writer.write(HEAD)  # accepted; its first token comes after the first-token deadline
    await writer.drain()
    await asyncio.sleep(0.6)
    writer.write(_chunk(TOKEN_LINE))
    await writer.drain()
    await asyncio.sleep(30)


@pytest.fixture
async def servers() -> AsyncIterator[Callable[[Handler], Awaitable[ReplicaLoad]]]:
    """Start a local server per handler; each is a replica of the plan."""
    started: list[asyncio.Server] = []

    async def start(handler: Handler) -> ReplicaLoad:
        server = await asyncio.start_server(handler, "127.0.0.1", 0)
        started.append(server)
        port = server.sockets[0].getsockname()[1]
        return ReplicaLoad(f"r{len(started)}", f"http://127.0.0.1:{port}", 0)

    yield start
    for server in started:
        server.close()


async def test_a_silent_replica_is_given_up_at_the_first_token_deadline_and_the_next_serves(servers) -> None:
    silent, serving = await servers(_silent), await servers(_one_line_then_silent)
    failed: list[str] = []
    client = ReplicaClient("t")
    try:
        started = time.monotonic()
        upstream = await client.open(
            [silent, serving],
            GenerateRequest(prompt_token_ids=[1]),
            failed.append,
            first_token_s=0.3,
            stall_s=0.3,
        )
        assert time.monotonic() - started >= 0.3
        assert failed == [silent.replica_id] and upstream.replica == serving and upstream.retried
        lines = upstream.lines()
        assert await anext(lines) == TOKEN_LINE.rstrip(b"\n")
        with pytest.raises(UpstreamStalled):
            await anext(lines)
        await upstream.aclose()
    finally:
        await client.aclose()


async def test_every_replica_silent_is_unavailable_timed_out(servers) -> None:
    plan = [await servers(_silent), await servers(_silent)]
    failed: list[str] = []
    client = ReplicaClient("t")
    try:
        with pytest.raises(ReplicaUnavailable) as exc:
            await client.open(plan, GenerateRequest(prompt_token_ids=[1]), failed.append, first_token_s=0.2)
        assert exc.value.timed_out and failed == [r.replica_id for r in plan]
    finally:
        await client.aclose()


async def test_a_replica_that_answers_but_sends_no_token_in_time_is_busy_not_failed(servers) -> None:
    busy, serving = await servers(_head_then_silent), await servers(_one_line_then_silent)
    failed: list[str] = []
    client = ReplicaClient("t")
    try:
        upstream = await client.open(
            [busy, serving], GenerateRequest(prompt_token_ids=[1]), failed.append, first_token_s=0.3
        )
        assert upstream.replica == serving and failed == []
        await upstream.aclose()
    finally:
        await client.aclose()


async def test_the_last_replica_to_try_that_answered_keeps_the_request_past_the_deadline(servers) -> None:
    slow = await servers(_head_then_one_line_late)
    failed: list[str] = []
    client = ReplicaClient("t")
    try:
        upstream = await client.open(
            [slow], GenerateRequest(prompt_token_ids=[1]), failed.append, first_token_s=0.2
        )
        assert upstream.replica == slow and failed == []  # queued, not hung: waited past 0.2 s
        await upstream.aclose()
    finally:
        await client.aclose()


def _refusing(status: int, code: str, retry_after: str) -> Handler:
    body = ErrorBody(error=ErrorDetail(message=f"{code} here", type="server_error", code=code))
    payload = body.model_dump_json().encode()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\nretry-after: %s\r\ncontent-length: %d\r\n\r\n%s"
            % (status, retry_after.encode(), len(payload), payload)
        )
        await writer.drain()
        writer.close()

    return handler


async def test_a_tenant_cap_429_is_the_requests_fault_and_keeps_the_replicas_retry_after(servers) -> None:
    capped, never = await servers(_refusing(429, "too_many_cold_loads", "7")), await servers(_silent)
    client = ReplicaClient("t")
    try:
        with pytest.raises(ReplicaRejected) as exc:
            await client.open([capped, never], GenerateRequest(prompt_token_ids=[1]), lambda _: None)
        assert (exc.value.status, exc.value.error.code, exc.value.retry_after) == (
            429,
            "too_many_cold_loads",
            "7",
        )
        error = public_error(exc.value)
        assert (error.status, error.code, error.headers) == (429, "too_many_cold_loads", {"Retry-After": "7"})
    finally:
        await client.aclose()


async def test_owners_that_all_answer_503_give_the_client_the_last_ones_code_and_retry_after(servers) -> None:
    plan = [
        await servers(_refusing(503, "cold_loads_full", "2")),
        await servers(_refusing(503, "adapter_loading_failed", "3")),
    ]
    failed: list[str] = []
    client = ReplicaClient("t")
    try:
        with pytest.raises(ReplicaUnavailable) as exc:
            await client.open(plan, GenerateRequest(prompt_token_ids=[1]), failed.append)
        assert failed == []  # they answered: refusing, not failed
        error = public_error(exc.value)
        assert (error.status, error.code) == (503, "adapter_loading_failed")
        assert error.headers == {"Retry-After": "3"} and error.body()["error"]["type"] == "server_error"
    finally:
        await client.aclose()


async def test_an_unreachable_owner_after_a_refusal_is_no_replica_available(servers) -> None:
    refusing = await servers(_refusing(503, "cold_loads_full", "2"))
    gone = ReplicaLoad("gone", "http://127.0.0.1:1", 0)  # nothing listens on port 1
    client = ReplicaClient("t")
    try:
        with pytest.raises(ReplicaUnavailable) as exc:
            await client.open([refusing, gone], GenerateRequest(prompt_token_ids=[1]), lambda _: None)
        error = public_error(exc.value)
        assert (error.status, error.code, error.headers) == (
            503,
            "no_replica_available",
            {"Retry-After": "1"},
        )
    finally:
        await client.aclose()


@pytest.mark.parametrize(
    ("sent", "passed_on"), [("7", "7"), ("0.2", "1"), ("1e9", "3600"), ("soon", "1"), (None, "1")]
)
def test_an_upstream_retry_after_is_passed_on_in_whole_bounded_seconds(
    sent: str | None, passed_on: str
) -> None:
    assert retry_after_of(sent) == passed_on


async def test_a_503_not_about_the_adapters_load_is_no_replica_available(servers) -> None:
    plan = [await servers(_refusing(503, "replica_draining", "5"))]
    client = ReplicaClient("t")
    try:
        with pytest.raises(ReplicaUnavailable) as exc:
            await client.open(plan, GenerateRequest(prompt_token_ids=[1]), lambda _: None)
        assert public_error(exc.value).code == "no_replica_available"
    finally:
        await client.aclose()


async def test_a_gateway_out_of_connections_is_overloaded_and_marks_no_replica_failed(servers) -> None:
    """Both connections of the pool hold streams: the third request waits the pool timeout, then is the
    gateway's own 503 gateway_overloaded; the replicas are healthy and none is reported failed."""
    a, b = await servers(_one_line_then_silent), await servers(_one_line_then_silent)
    failed: list[str] = []
    client = ReplicaClient("t", max_connections=2, pool_timeout_s=0.2)
    held = []
    try:
        for replica in (a, b):
            held.append(await client.open([replica], GenerateRequest(prompt_token_ids=[1]), failed.append))
        started = time.monotonic()
        with pytest.raises(ReplicaUnavailable) as exc:
            await client.open([a, b], GenerateRequest(prompt_token_ids=[1]), failed.append, first_token_s=5)
        assert exc.value.pool_exhausted and time.monotonic() - started < 2
        assert failed == []
        error = public_error(exc.value)
        assert (error.status, error.code) == (503, "gateway_overloaded")
        await held.pop().aclose()  # a connection comes back: the next request is served
        upstream = await client.open([b], GenerateRequest(prompt_token_ids=[1]), failed.append)
        held.append(upstream)
        assert failed == []
    finally:
        for upstream in held:
            await upstream.aclose()
        await client.aclose()
