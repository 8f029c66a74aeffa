"""A small HTTP/1.1 server on asyncio's Protocol API, for the stand-in replica.

It parses keep-alive requests with a Content-Length body (what httpx sends) and answers either a whole
body or a chunked stream whose pieces the handler writes straight to the transport, so a token costs one
write and no coroutine switch. That keeps the stand-in cheap next to the gateway it is measured against.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 1 << 20


@dataclass
class Request:
    """One parsed request: method, path, lowercase header names, body."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Stream:
    """A chunked response in progress; the handler writes pieces and ends it, or learns it was cut."""

    transport: asyncio.Transport
    on_end: Callable[[], None]
    closed: bool = False
    cancel: list[Callable[[], None]] = field(default_factory=list)

    def write(self, piece: bytes) -> None:
        if not self.closed:
            self.transport.write(b"%x\r\n%b\r\n" % (len(piece), piece))

    def end(self) -> None:
        if not self.closed:
            self.closed = True
            self.transport.write(b"0\r\n\r\n")
            self.on_end()

    def cut(self) -> None:
        """The connection went away: stop whatever the handler scheduled."""
        self.closed = True
        for cancel in self.cancel:
            cancel()
        self.cancel.clear()


def head(status: int, headers: dict[str, str], length: int | None) -> bytes:
    """The status line and headers; chunked when length is None."""
    lines = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    lines.append(f"content-length: {length}" if length is not None else "transfer-encoding: chunked")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


Handler = Callable[[Request, "Connection"], None]


class Connection(asyncio.Protocol):
    """One client connection: requests one after another (no pipelining), answered by the handler."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.busy = False  # a response is in progress; the next request waits for it
        self.stream: Stream | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        if self.stream is not None:
            self.stream.cut()
            self.stream = None

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self._next()

    def _next(self) -> None:
        """Parse and dispatch the next whole request in the buffer, if no response is in progress."""
        if self.busy or self.transport is None:
            return
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buffer) > MAX_HEAD_BYTES:
                self.transport.close()
            return
        lines = self.buffer[:end].decode("latin-1").split("\r\n")
        try:
            method, path, _ = lines[0].split(" ", 2)
        except ValueError:
            self.transport.close()
            return
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0") or 0)
        if length > MAX_BODY_BYTES or "chunked" in headers.get("transfer-encoding", ""):
            self.transport.close()
            return
        start = end + 4
        if len(self.buffer) < start + length:
            return
        body, self.buffer = self.buffer[start : start + length], self.buffer[start + length :]
        self.busy = True
        self.handler(Request(method, path, headers, body), self)

    def respond(self, status: int, headers: dict[str, str], body: bytes) -> None:
        """A whole response."""
        assert self.transport is not None
        self.transport.write(head(status, headers, len(body)) + body)
        self._done()

    def open_stream(self, headers: dict[str, str]) -> Stream:
        """A 200 with a chunked body; the request is over when the handler ends the stream."""
        assert self.transport is not None
        self.transport.write(head(200, headers, None))
        self.stream = Stream(self.transport, self._done)
        return self.stream

    def _done(self) -> None:
        self.busy = False
        self.stream = None
        if self.buffer:
            self._next()


async def serve_http(handler: Handler, host: str, port: int) -> asyncio.Server:
    """Listen on host:port (0: any free port) and answer every connection with handler."""
    loop = asyncio.get_running_loop()
    return await loop.create_server(lambda: Connection(handler), host, port, backlog=4096)
