"""A text/event-stream response over an iterator of already framed SSE bytes, through a bounded buffer.

A reader task pulls frames from the iterator into a buffer and a sender task writes them out, one ASGI body
message each, as the client takes them. A client that stops reading fills the buffer: once the frames not
yet sent pass buffer_bytes, or one message waits send_timeout_s for the client to take it, the stream is
cut (the iterator is closed, which closes the replica stream and frees its row there) and the connection
ends. A client that disconnects cancels both at once (the
iterator's cleanup runs). A comment ping keeps an idle stream open through proxies. The headers are those
of an SSE stream: no caching, keep-alive, no proxy buffering.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import AsyncGenerator, Callable, Mapping

import anyio
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

log = logging.getLogger(__name__)

PING = b": ping\r\n\r\n"
_SSE_HEADERS = {"Cache-Control": "no-store", "Connection": "keep-alive", "X-Accel-Buffering": "no"}
_END_S = 1.0  # how long the final empty message may wait on a client that is not reading


class SseResponse(Response):
    media_type = "text/event-stream"

    def __init__(
        self,
        frames: AsyncGenerator[bytes, None],
        headers: Mapping[str, str] | None = None,
        ping_s: float = 15.0,
        buffer_bytes: int = 256 * 1024,
        send_timeout_s: float = 30.0,
        on_cut: Callable[[], None] | None = None,
    ) -> None:
        self.frames = frames
        self.ping_s = ping_s
        self.buffer_bytes = buffer_bytes
        self.send_timeout_s = send_timeout_s
        self.on_cut = on_cut
        self.status_code = 200
        self.background = None
        self.init_headers({**(headers or {}), **_SSE_HEADERS})
        self.buffered = 0  # bytes read from the iterator and not yet handed to the server
        self.cut = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        to_send, pending = anyio.create_memory_object_stream[bytes](math.inf)
        async with anyio.create_task_group() as tg:

            def cut_off(why: str) -> None:
                self.cut = True
                log.warning("client not reading: stream cut (%s) with %d bytes unsent", why, self.buffered)
                if self.on_cut is not None:
                    self.on_cut()
                tg.cancel_scope.cancel()

            async def read() -> None:
                async with to_send, contextlib.aclosing(self.frames) as frames:
                    async for body in frames:
                        if self.buffered + len(body) > self.buffer_bytes:
                            cut_off("buffer full")
                            return
                        self.buffered += len(body)
                        to_send.send_nowait(body)

            async def write() -> None:
                await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
                idle = self.ping_s if self.ping_s > 0 else math.inf
                async with pending:
                    while True:
                        with anyio.move_on_after(idle) as wait:
                            try:
                                body = await pending.receive()
                            except anyio.EndOfStream:
                                break
                        if wait.cancelled_caught:
                            body = PING
                        else:
                            self.buffered -= len(body)
                        with anyio.move_on_after(self.send_timeout_s) as sending:
                            await send({"type": "http.response.body", "body": body, "more_body": True})
                        if sending.cancelled_caught:
                            cut_off("send timed out")
                            return
                with anyio.move_on_after(_END_S):
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                tg.cancel_scope.cancel()

            async def watch_disconnect() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                tg.cancel_scope.cancel()

            tg.start_soon(read)
            tg.start_soon(write)
            tg.start_soon(watch_disconnect)
