"""A fault-injecting HTTP proxy on loopback, in front of a real server (the local S3).

Requests pass through unchanged (the Host header included, so S3 signatures still verify) until a fault is
set: `fail(n)` answers the next n matching requests with a 503 in S3's XML error shape, `stall(after)`
sends the first `after` bytes of matching response bodies and then nothing until `heal()`, `trickle(bps)`
sends matching bodies at about that many bytes a second. `match` picks requests by a substring of the path.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web
from yarl import URL

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "te", "upgrade"}
SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>ServiceUnavailable</Code>'
    b"<Message>injected by the fault proxy</Message></Error>"
)


@dataclass
class Faults:
    match: str = ""
    fail_left: int = 0
    status: int = 503
    stall_after: int | None = None
    stalls_left: int | None = None  # None: every matching body stalls
    bytes_per_s: float | None = None


@dataclass
class Seen:
    method: str
    path: str
    status: int


@dataclass
class FaultProxy:
    upstream: str
    faults: Faults = field(default_factory=Faults)
    seen: list[Seen] = field(default_factory=list)
    _healed: asyncio.Event = field(default_factory=asyncio.Event)
    _runner: web.AppRunner | None = None
    _session: aiohttp.ClientSession | None = None
    url: str = ""

    async def start(self) -> str:
        """Listen on a free loopback port; return the proxy's URL."""
        self._session = aiohttp.ClientSession(auto_decompress=False)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        self._healed.set()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    def fail(self, n: int, status: int = 503, match: str = "") -> None:
        self.faults = Faults(match=match, fail_left=n, status=status)

    def stall(self, after_bytes: int, times: int | None = None, match: str = "") -> None:
        self._healed.clear()
        self.faults = Faults(match=match, stall_after=after_bytes, stalls_left=times)

    def trickle(self, bytes_per_s: float, match: str = "") -> None:
        self.faults = Faults(match=match, bytes_per_s=bytes_per_s)

    def heal(self) -> None:
        """No more faults; stalled bodies go on."""
        self.faults = Faults()
        self._healed.set()

    def gets(self, match: str) -> list[Seen]:
        return [s for s in self.seen if s.method == "GET" and match in s.path]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        f = self.faults
        matched = f.match in request.path
        if matched and f.fail_left > 0:
            f.fail_left -= 1
            self.seen.append(Seen(request.method, request.path, f.status))
            return web.Response(status=f.status, body=SLOW_DOWN, content_type="application/xml")
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        body = await request.read()
        target = URL(self.upstream.rstrip("/") + request.raw_path, encoded=True)
        async with self._session.request(
            request.method, target, headers=headers, data=body or None, skip_auto_headers=("Content-Type",)
        ) as up:
            self.seen.append(Seen(request.method, request.path, up.status))
            out = web.StreamResponse(status=up.status)
            for k, v in up.headers.items():
                if k.lower() not in HOP_BY_HOP - {"content-length"}:
                    out.headers[k] = v
            await out.prepare(request)
            if request.method == "HEAD":
                await out.write_eof()
                return out
            stall_at = f.stall_after if matched else None
            if stall_at is not None and f.stalls_left is not None:
                if f.stalls_left <= 0:
                    stall_at = None
                else:
                    f.stalls_left -= 1
            bps = f.bytes_per_s if matched else None
            sent = 0
            try:
                async for chunk in up.content.iter_chunked(1 << 16):
                    if stall_at is not None and sent + len(chunk) > stall_at:
                        await out.write(chunk[: stall_at - sent])
                        await self._healed.wait()
                        chunk, sent = chunk[stall_at - sent :], stall_at
                        stall_at = None
                    if bps is not None:
                        await self._trickle(out, chunk, bps)
                    else:
                        await out.write(chunk)
                    sent += len(chunk)
                await out.write_eof()
            except (ConnectionError, aiohttp.ClientError):
                pass  # the client gave up on the body: what the fault was for
            return out

    async def _trickle(self, out: web.StreamResponse, chunk: bytes, bps: float) -> None:
        step = max(1, int(bps / 10))
        for i in range(0, len(chunk), step):
            await out.write(chunk[i : i + step])
            await asyncio.sleep(step / bps)
