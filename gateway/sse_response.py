"""A text/event-stream response over an iterator of already framed SSE bytes.

Each item goes out as one ASGI body message, as it comes. A client that disconnects cancels the iteration
at once (the iterator's cleanup runs), and a comment ping keeps an idle stream open through proxies. The
headers are those of an SSE stream: no caching, keep-alive, no proxy buffering.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator, Mapping

import anyio
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

PING = b": ping\r\n\r\n"
_SSE_HEADERS = {"Cache-Control": "no-store", "Connection": "keep-alive", "X-Accel-Buffering": "no"}


class SseResponse(Response):
    media_type = "text/event-stream"

    def __init__(
        self,
        frames: AsyncGenerator[bytes, None],
        headers: Mapping[str, str] | None = None,
        ping_s: float = 15.0,
    ) -> None:
        self.frames = frames
        self.ping_s = ping_s
        self.status_code = 200
        self.background = None
        self.init_headers({**(headers or {}), **_SSE_HEADERS})
        self._last_send = time.monotonic()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with anyio.create_task_group() as tg:

            async def stream() -> None:
                await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
                async with contextlib.aclosing(self.frames) as frames:
                    async for body in frames:
                        await send({"type": "http.response.body", "body": body, "more_body": True})
                        self._last_send = time.monotonic()
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                tg.cancel_scope.cancel()

            async def watch_disconnect() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                tg.cancel_scope.cancel()

            async def ping() -> None:
                while True:
                    await anyio.sleep(self.ping_s - (time.monotonic() - self._last_send))
                    if time.monotonic() - self._last_send >= self.ping_s:
                        await send({"type": "http.response.body", "body": PING, "more_body": True})
                        self._last_send = time.monotonic()

            tg.start_soon(stream)
            tg.start_soon(watch_disconnect)
            if self.ping_s > 0:
                tg.start_soon(ping)
