"""A replica killed during its prefill, and a client that stops reading, through the real public gateway
and two real SmolLM2 replicas.

Both replicas run with the replica's fault-injection prefill delay, so a request sits in its prefill long
enough to kill its replica there. (A stack of its own: the delay would change the timings that
test_replica_faults.py's deadlines are set against.) Every reservation is checked returned at the end.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httpx
import pytest
from httpx_sse import EventSource

from harness.stacks.gateway import GatewayStack
from schemas.events import RequestCompleted, parse_event
from schemas.topics import REQUESTS_COMPLETED
from tests.integration.gateway_probes import (
    auth,
    fault_stack,
    gateway_metrics,
    reservations_returned,
)
from tests.integration.kafka_helpers import collect, read_to_end
from tests.integration.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PREFILL_DELAY_S = 3.0
HEADER_TIMEOUT_S, PER_CLIENT = 2.0, 16
CHAT = {"model": "acme/support:prod", "messages": [{"role": "user", "content": "Tell me a long story."}]}


@pytest.fixture(scope="module")
async def stack(services, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[GatewayStack]:
    settings = {
        "LORAFLEET_REPLICA_FAULT_PREFILL_DELAY_S": str(PREFILL_DELAY_S),
        "LORAFLEET_GATEWAY_FIRST_TOKEN_TIMEOUT_S": str(PREFILL_DELAY_S + 20),
        "LORAFLEET_GATEWAY_STALL_TIMEOUT_S": str(PREFILL_DELAY_S + 20),
        # a small stream buffer and send deadline, so a client that stops reading is cut soon
        "LORAFLEET_GATEWAY_STREAM_BUFFER_BYTES": "16384",
        "LORAFLEET_GATEWAY_CLIENT_SEND_TIMEOUT_S": "5",
        "LORAFLEET_GATEWAY_SOCKET_SEND_BUFFER_BYTES": "4096",
        # each tenant may have two requests open at once (the other tests here open one at a time)
        "LORAFLEET_GATEWAY_MAX_CONCURRENT_REQUESTS_PER_TENANT": "2",
        # short edge deadlines and a small per-address connection cap, for the slowloris test
        "LORAFLEET_HTTP_HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S),
        "LORAFLEET_GATEWAY_BODY_READ_TIMEOUT_S": str(HEADER_TIMEOUT_S),
        "LORAFLEET_HTTP_MAX_CONNECTIONS_PER_CLIENT": str(PER_CLIENT),
        # loopback is a trusted proxy by default, exempt from that cap: here it is a client like any other
        "FORWARDED_ALLOW_IPS": "192.0.2.1",
    }
    async with fault_stack(services, tmp_path_factory, "sft", settings, returned_s=60) as s:
        yield s


def _requests(m: dict, status: str) -> float:
    return m.get(("gateway_requests_total", (("status", status),)), 0.0)


async def _busy_replica(stack: GatewayStack, among: set[str] | None = None) -> str:
    """The replica (of among, default all) with a request in flight now."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for rid in among or stack.replicas:
            st = await stack.state(rid)
            if st["queue_depth"] or st["tokens_in_flight"]:
                return rid
        await asyncio.sleep(0.05)
    raise AssertionError("no replica has the request in flight")


async def _idle(stack: GatewayStack, replica_id: str) -> bool:
    st = await stack.state(replica_id)
    return not (st["queue_depth"] or st["tokens_in_flight"])


class SlowReader:
    """A raw socket with a small receive buffer that sends one streaming chat request, reads until the
    first SSE message, and then reads nothing more until told to drain."""

    def __init__(self, url: str, key: str, body: dict) -> None:
        parts = urlsplit(url)
        self.addr = (parts.hostname or "127.0.0.1", parts.port or 80)
        payload = json.dumps(body).encode()
        self.request = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: {parts.netloc}\r\n"
            f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n"
        ).encode() + payload
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: the window
        self.received = b""

    def first_message(self, timeout_s: float = 60.0) -> bytes:
        self.sock.settimeout(timeout_s)
        self.sock.connect(self.addr)
        self.sock.sendall(self.request)
        while b"\ndata: " not in self.received:
            chunk = self.sock.recv(1024)
            assert chunk, self.received
            self.received += chunk
        return self.received

    def drain(self, timeout_s: float = 60.0) -> bytes:
        """Everything left, up to the end of the connection."""
        self.sock.settimeout(timeout_s)
        try:
            while chunk := self.sock.recv(65536):
                self.received += chunk
        except ConnectionResetError:
            pass
        return self.received

    def close(self) -> None:
        self.sock.close()


async def test_a_client_that_stops_reading_is_cut_its_row_freed_and_others_stream_on(
    stack: GatewayStack,
) -> None:
    before = await gateway_metrics(stack)
    cut_before = before.get(("gateway_streams_cut_total", ()), 0.0)
    # A long, high-temperature completion: far more bytes than the socket buffers and the stream's own.
    slow_body = {**CHAT, "max_tokens": 1800, "temperature": 1.5, "stream": True}
    slow = SlowReader(stack.url, stack.keys["acme"], slow_body)
    try:
        head = await asyncio.to_thread(slow.first_message)
        assert head.startswith(b"HTTP/1.1 200"), head[:200]
        serving = await _busy_replica(stack)
        # Another tenant's stream at the same time runs to its end, unaffected by the stuck one.
        async with httpx.AsyncClient(base_url=stack.url, timeout=120) as c:
            other = {"model": "globex/sales:prod", "messages": CHAT["messages"], "max_tokens": 24}
            headers = {"Authorization": f"Bearer {stack.keys['globex']}"}
            async with c.stream(
                "POST", "/v1/chat/completions", json={**other, "stream": True}, headers=headers
            ) as r:
                assert r.status_code == 200
                data = [sse.data async for sse in EventSource(r).aiter_sse()]
            assert data[-1] == "[DONE]" and len(data) > 2, data[-3:]

        async def cut() -> bool:
            return (await gateway_metrics(stack)).get(
                ("gateway_streams_cut_total", ()), 0.0
            ) == cut_before + 1

        # About 100 KB (the kernel's buffers and the server's write buffer) go out before a send blocks: a
        # few hundred tokens, minutes on a loaded CPU.
        await wait_until(cut, "the stuck stream to be cut", 600)
        # The gateway closed its replica stream: the replica aborted the generation and freed its row.
        await wait_until(lambda: _idle(stack, serving), "the replica to free the stuck stream's row", 60)
        rest = await asyncio.to_thread(slow.drain)
        assert b"data: [DONE]" not in rest, "the stream ran to its end: nothing was cut"
    finally:
        slow.close()
    await wait_until(lambda: reservations_returned(stack), "the stream's reservation to be returned", 60)


async def test_a_tenant_past_its_open_requests_gets_429_and_another_tenant_is_served(
    stack: GatewayStack,
) -> None:
    """Two acme streams sit in their prefill (the fault delay): a third acme request is refused at once with
    429 concurrency_limit_exceeded in OpenAI's shape, globex is served meanwhile, and once the two end acme
    is served again."""
    body = {**CHAT, "max_tokens": 4, "stream": True}

    async def stream(c: httpx.AsyncClient, headers: dict[str, str]) -> int:
        async with c.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
            await r.aread()
            return r.status_code

    async def open_requests(n: float) -> bool:
        return (await gateway_metrics(stack)).get(("gateway_inflight_requests", ()), 0.0) == n

    globex = {"Authorization": f"Bearer {stack.keys['globex']}"}
    async with httpx.AsyncClient(base_url=stack.url, timeout=120) as c:
        held = [asyncio.create_task(stream(c, auth(stack))) for _ in range(2)]
        await wait_until(lambda: open_requests(2), "two acme requests admitted", 30)
        refused = await c.post("/v1/chat/completions", json={**body, "stream": False}, headers=auth(stack))
        assert refused.status_code == 429, refused.text
        error = refused.json()["error"]
        assert error["code"] == "concurrency_limit_exceeded" and refused.headers["retry-after"] == "1"
        other = {**body, "model": "globex/sales:prod"}
        async with c.stream("POST", "/v1/chat/completions", json=other, headers=globex) as r:
            assert r.status_code == 200
            await r.aread()
        assert await asyncio.gather(*held) == [200, 200]
        assert await stream(c, auth(stack)) == 200
    await wait_until(lambda: reservations_returned(stack), "every reservation returned", 60)


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closed sock within seconds (reading what it may send before it does)."""
    sock.settimeout(seconds)
    try:
        while sock.recv(4096):
            pass
        return True
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


async def test_slow_headers_a_trickled_body_and_a_socket_hog_are_cut_while_others_are_served(
    stack: GatewayStack,
) -> None:
    """A client sending its headers a byte at a time is disconnected at the header deadline; one trickling
    its body gets 408 at the body deadline; an address opening more connections than its cap has the extra
    ones closed as they are accepted. Meanwhile another tenant is served."""
    host, port = urlsplit(stack.url).hostname or "127.0.0.1", urlsplit(stack.url).port or 80

    def slowloris() -> float:
        sock = socket.create_connection((host, port))
        started = time.monotonic()
        try:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
            sock.settimeout(0.5)
            for byte in b"X-Slow: " + b"a" * 40:  # one byte every half second: never a whole header block
                try:
                    sock.sendall(bytes([byte]))
                    if sock.recv(1) == b"":
                        break
                except TimeoutError:
                    continue
                except (BrokenPipeError, ConnectionResetError):
                    break
            return time.monotonic() - started
        finally:
            sock.close()

    def trickled_body() -> bytes:
        sock = socket.create_connection((host, port))
        try:
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                + f"Authorization: Bearer {stack.keys['acme']}\r\nContent-Length: 100\r\n\r\n{{".encode()
            )
            sock.settimeout(10 * HEADER_TIMEOUT_S)
            answer = b""
            while b"request_timeout" not in answer and (chunk := sock.recv(4096)):  # head and body may split
                answer += chunk
            return answer
        finally:
            sock.close()

    hog = asyncio.to_thread(slowloris)
    body = asyncio.to_thread(trickled_body)
    async with httpx.AsyncClient(base_url=stack.url, timeout=120) as c:
        other = {"model": "globex/sales:prod", "messages": CHAT["messages"], "max_tokens": 4}
        served = c.post(
            "/v1/chat/completions", json=other, headers={"Authorization": f"Bearer {stack.keys['globex']}"}
        )
        held, answer, response = await asyncio.gather(hog, body, served)
    assert held < 4 * HEADER_TIMEOUT_S, f"the slow-header client held its socket {held:.1f} s"
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"request_timeout" in answer
    assert response.status_code == 200, response.text

    socks = [socket.create_connection((host, port)) for _ in range(PER_CLIENT + 4)]
    try:
        cut = [await asyncio.to_thread(_closed_within, s, 0.5) for s in socks]
        assert sum(cut) >= 4, cut  # at least the ones past the cap (other local clients may hold a few)
    finally:
        for s in socks:
            s.close()
    # every socket of the hog is gone (the cap's and the header deadline's): the address is served again
    await asyncio.sleep(HEADER_TIMEOUT_S + 0.5)
    async with httpx.AsyncClient(base_url=stack.url, timeout=120) as c:
        assert (await c.get("/v1/models", headers=auth(stack))).status_code == 200


async def _completed_events(stack: GatewayStack, request_id: str) -> list[RequestCompleted]:
    """Every requests.completed event published for request_id (read to the topic's end)."""

    def mine(r) -> bool:  # noqa: ANN001 - other tests may leave records that are not JSON on the topic
        return request_id.encode() in r.value

    bootstrap = stack.env["LORAFLEET_KAFKA_BOOTSTRAP"]
    await collect(bootstrap, REQUESTS_COMPLETED.name, lambda rs: len(rs) >= 1, accept=mine)
    records = await read_to_end(bootstrap, REQUESTS_COMPLETED.name, accept=mine)
    events = [parse_event(r.value, REQUESTS_COMPLETED.name) for r in records]
    return [e for e in events if isinstance(e, RequestCompleted)]


async def test_a_replica_killed_during_prefill_is_retried_once_elsewhere_and_recorded_once(
    stack: GatewayStack,
) -> None:
    """Last in the module: it kills a replica."""
    before = await gateway_metrics(stack)
    async with httpx.AsyncClient(base_url=stack.url, headers=auth(stack), timeout=120) as c:
        pending = asyncio.create_task(c.post("/v1/chat/completions", json={**CHAT, "max_tokens": 8}))
        victim = await _busy_replica(stack)  # the request is in its (delayed) prefill there
        assert not pending.done()
        proc = stack.replicas[victim].proc
        assert proc is not None
        proc.kill()
        proc.wait(30)
        resp = await pending
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["message"]["content"]
    survivor = next(rid for rid in stack.replicas if rid != victim)
    after = await gateway_metrics(stack)
    assert after.get(("gateway_replica_failures_total", (("replica", victim),)), 0.0) == 1
    assert _requests(after, "200") == _requests(before, "200") + 1
    assert _requests(after, "error") == _requests(before, "error")
    # Recorded once: one requests.completed, ok, served by the survivor.
    events = await _completed_events(stack, resp.headers["x-request-id"])
    assert len(events) == 1, events
    assert events[0].status == "ok" and events[0].replica_id == survivor, events[0]
    assert events[0].completion_tokens > 0
    await wait_until(lambda: reservations_returned(stack), "the reservation to be returned", 60)
