"""SseResponse over a raw ASGI exchange: frames go out one message each, an idle stream is pinged, and a
client that disconnects stops the iterator at once (its cleanup runs)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from starlette.types import Message

from gateway.sse_response import PING, SseResponse


class Exchange:
    """The ASGI side of one HTTP request: what was sent, and a disconnect to deliver on demand."""

    def __init__(self) -> None:
        self.sent: list[Message] = []
        self.disconnect = asyncio.Event()

    async def receive(self) -> Message:
        await self.disconnect.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        self.sent.append(message)

    def bodies(self) -> list[bytes]:
        return [m["body"] for m in self.sent if m["type"] == "http.response.body"]


async def _run(response: SseResponse, exchange: Exchange) -> None:
    scope = {"type": "http", "method": "POST", "headers": []}
    await asyncio.wait_for(response(scope, exchange.receive, exchange.send), 5)


async def test_each_frame_is_one_body_message_then_the_end() -> None:
    async def frames() -> AsyncGenerator[bytes, None]:
        yield b"data: a\r\n\r\n"
        yield b"data: b\r\n\r\n"

    exchange = Exchange()
    await _run(SseResponse(frames(), {"x-request-id": "req_1"}), exchange)
    start = exchange.sent[0]
    headers = dict(start["headers"])
    assert start["status"] == 200 and headers[b"content-type"].startswith(b"text/event-stream")
    assert headers[b"cache-control"] == b"no-store" and headers[b"x-request-id"] == b"req_1"
    assert exchange.bodies() == [b"data: a\r\n\r\n", b"data: b\r\n\r\n", b""]
    assert exchange.sent[-1]["more_body"] is False


async def test_an_idle_stream_is_pinged() -> None:
    async def frames() -> AsyncGenerator[bytes, None]:
        yield b"data: a\r\n\r\n"
        await asyncio.sleep(0.35)
        yield b"data: b\r\n\r\n"

    exchange = Exchange()
    await _run(SseResponse(frames(), ping_s=0.1), exchange)
    bodies = exchange.bodies()
    assert bodies[0] == b"data: a\r\n\r\n" and bodies[-2:] == [b"data: b\r\n\r\n", b""]
    assert 2 <= bodies.count(PING) <= 4 and set(bodies[1:-2]) == {PING}


async def test_a_disconnect_stops_the_iterator_and_runs_its_cleanup() -> None:
    cleaned = asyncio.Event()

    async def frames() -> AsyncGenerator[bytes, None]:
        try:
            yield b"data: a\r\n\r\n"
            await asyncio.sleep(30)
            yield b"data: never\r\n\r\n"
        finally:
            cleaned.set()

    exchange = Exchange()
    task = asyncio.create_task(_run(SseResponse(frames()), exchange))
    await asyncio.sleep(0.05)
    exchange.disconnect.set()
    await task
    assert cleaned.is_set()
    assert exchange.bodies() == [b"data: a\r\n\r\n"]


class StoppedReader(Exchange):
    """A client that takes the response head and then reads nothing: every body message blocks."""

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.body":
            await asyncio.Event().wait()
        self.sent.append(message)


async def test_a_client_that_stops_reading_is_cut_once_the_buffer_is_full() -> None:
    closed = asyncio.Event()
    produced = 0

    async def endless() -> AsyncGenerator[bytes, None]:
        nonlocal produced
        try:
            while True:
                produced += 1
                yield b"data: %06d\r\n\r\n" % produced
                await asyncio.sleep(0)
        finally:
            closed.set()

    cuts: list[bool] = []
    response = SseResponse(endless(), buffer_bytes=1024, send_timeout_s=30, on_cut=lambda: cuts.append(True))
    await _run(response, StoppedReader())
    frame = len(b"data: 000001\r\n\r\n")
    assert closed.is_set() and cuts == [True] and response.cut
    assert response.buffered <= 1024 and produced <= 1024 // frame + 2


async def test_a_send_that_waits_past_its_deadline_cuts_the_stream() -> None:
    closed = asyncio.Event()

    async def two() -> AsyncGenerator[bytes, None]:
        try:
            yield b"data: a\r\n\r\n"
            yield b"data: b\r\n\r\n"
        finally:
            closed.set()

    response = SseResponse(two(), send_timeout_s=0.1)
    await _run(response, StoppedReader())
    assert closed.is_set() and response.cut
