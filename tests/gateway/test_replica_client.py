"""ReplicaClient against real sockets: a replica that accepts and says nothing is given up on at the
first-token deadline and the next one serves; one that goes silent mid-stream raises UpstreamStalled."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from gateway.replica_client import ReplicaClient, ReplicaUnavailable, UpstreamStalled
from gateway.routing import ReplicaLoad
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
