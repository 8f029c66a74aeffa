"""A replica that stops answering (SIGSTOP), through the real public gateway and two real SmolLM2 replicas.

The gateway's replica staleness is set far above the deadlines here, so a stopped replica still looks live
by its last state: only the first-token and stall deadlines (and the failure mark they set) keep requests
off it. Every reservation is checked returned at the end, on the gateway's own in-flight gauges.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from httpx_sse import EventSource

from harness.stacks.gateway import GatewayStack
from tests.integration.gateway_probes import (
    auth,
    fault_stack,
    gateway_metrics,
    live_is,
    reservations_returned,
)
from tests.integration.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FIRST_TOKEN_S = 4.0
STALL_S = 4.0
CHAT = {"model": "acme/support:prod", "messages": [{"role": "user", "content": "Tell me a long story."}]}


@pytest.fixture(scope="module")
async def stack(services, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[GatewayStack]:
    settings = {
        "LORAFLEET_GATEWAY_REPLICA_STALE_S": "600",
        "LORAFLEET_GATEWAY_FIRST_TOKEN_TIMEOUT_S": str(FIRST_TOKEN_S),
        "LORAFLEET_GATEWAY_STALL_TIMEOUT_S": str(STALL_S),
        # the less loaded replica goes first even where the other holds the adapter in a GPU slot
        "LORAFLEET_GATEWAY_ROUTING_MODE": "affinity",
        "LORAFLEET_GATEWAY_GPU_PREFERENCE_TOKENS": "0",
    }
    async with fault_stack(services, tmp_path_factory, "rft", settings, returned_s=30) as s:
        yield s


def _tail(log: Path, lines: int = 15) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


async def _failures(stack: GatewayStack, replica_id: str) -> float:
    return (await gateway_metrics(stack)).get(
        ("gateway_replica_failures_total", (("replica", replica_id),)), 0.0
    )


async def _routes(stack: GatewayStack, choice: str) -> float:
    """Requests routed whose first choice served (first), or a later replica (fallback)."""
    return sum(
        n
        for (name, labels), n in (await gateway_metrics(stack)).items()
        if name == "gateway_routes_total" and dict(labels).get("choice") == choice
    )


async def _busy_replica(stack: GatewayStack) -> str:
    """The replica with a request in flight now."""
    for _ in range(100):
        for rid in stack.replicas:
            st = await stack.state(rid)
            if st["queue_depth"] or st["tokens_in_flight"]:
                return rid
        await asyncio.sleep(0.05)
    raise AssertionError("no replica has the request in flight")


async def _idle(stack: GatewayStack, replica_id: str) -> bool:
    st = await stack.state(replica_id)
    return not (st["queue_depth"] or st["tokens_in_flight"])


@contextmanager
def stopped(stack: GatewayStack, *replica_ids: str) -> Iterator[None]:
    """SIGSTOP these replicas for the block; SIGCONT them however it ends."""
    procs = [stack.replicas[rid].proc for rid in replica_ids]
    try:
        for p in procs:
            assert p is not None
            p.send_signal(signal.SIGSTOP)
        yield
    finally:
        for p in procs:
            assert p is not None
            p.send_signal(signal.SIGCONT)


async def _events(resp: httpx.Response) -> AsyncIterator[tuple[str | None, str]]:
    async for sse in EventSource(resp).aiter_sse():
        yield (None if sse.event == "message" else sse.event), sse.data


async def test_a_replica_stopped_before_its_first_token_is_retried_elsewhere_and_routed_to_again(
    stack: GatewayStack,
) -> None:
    async with httpx.AsyncClient(base_url=stack.url, headers=auth(stack), timeout=120) as c:
        # A long stream keeps one replica busy, so the router's first choice for the next request is the other.
        body = {**CHAT, "max_tokens": 400, "stream": True}
        async with c.stream("POST", "/v1/chat/completions", json=body) as long:
            events = _events(long)
            await anext(events)
            busy = await _busy_replica(stack)
            victim = next(rid for rid in stack.replicas if rid != busy)
            fallbacks = await _routes(stack, "fallback")
            with stopped(stack, victim):
                started = time.monotonic()
                first = await c.post("/v1/chat/completions", json={**CHAT, "max_tokens": 4})
                waited = time.monotonic() - started
                assert first.status_code == 200, first.text
                assert waited >= FIRST_TOKEN_S, "the request did not go to the stopped replica first"
                assert await _failures(stack, victim) == 1
                assert await _routes(stack, "fallback") == fallbacks + 1  # counted as served by its second
                assert not await live_is(stack, set(stack.replicas))  # marked unhealthy for routing
                second = await c.post("/v1/chat/completions", json={**CHAT, "max_tokens": 4})
                assert second.status_code == 200, second.text
                assert await _failures(stack, victim) == 1, "the marked replica was tried again"
            async for _ in events:  # the long stream finishes on its own replica
                pass
        # Its next replica.state puts it back in the router's view, and requests reach it again.
        await wait_until(lambda: live_is(stack, set(stack.replicas)), "the resumed replica to be live", 60)
        for rid in stack.replicas:
            await wait_until(lambda rid=rid: _idle(stack, rid), f"{rid} to finish its requests", 120)
        # With one replica busy, the next requests go to the other: both serve again. Up to three more
        # streams, each kept open: a load report that lags the first stream may send the second beside it,
        # but a replica left out of routing never gets any.
        async with contextlib.AsyncExitStack() as streams:
            again = await streams.enter_async_context(c.stream("POST", "/v1/chat/completions", json=body))
            kept = [_events(again)]  # kept: a dropped iterator closes its stream
            await anext(kept[0])
            first_busy = await _busy_replica(stack)
            rest = next(rid for rid in stack.replicas if rid != first_busy)
            for _ in range(3):
                other = await streams.enter_async_context(c.stream("POST", "/v1/chat/completions", json=body))
                kept.append(_events(other))
                await anext(kept[-1])
                if not await _idle(stack, rest):
                    break
            assert not await _idle(stack, rest), _tail(stack.gateway_log)


async def test_a_replica_stopped_mid_stream_ends_it_with_an_upstream_timeout_event(
    stack: GatewayStack,
) -> None:
    async with httpx.AsyncClient(base_url=stack.url, headers=auth(stack), timeout=120) as c:
        body = {**CHAT, "max_tokens": 400, "stream": True}
        async with c.stream("POST", "/v1/chat/completions", json=body) as r:
            seen: list[tuple[str | None, str]] = []
            async for event, data in _events(r):
                seen.append((event, data))
                if len(seen) == 3:
                    victim = await _busy_replica(stack)
                    stack.replicas[victim].proc.send_signal(signal.SIGSTOP)  # type: ignore[union-attr]
                    stopped_at = time.monotonic()
            ended = time.monotonic() - stopped_at
        try:
            assert seen[-1][0] == "error", seen[-3:]
            error = json.loads(seen[-1][1])["error"]
            assert error["code"] == "upstream_timeout" and set(error) == {"message", "type", "param", "code"}
            assert all(data != "[DONE]" for _, data in seen)
            assert ended < STALL_S + 60  # the stall counts from the last byte, which came before the stop
            assert await _failures(stack, victim) >= 1
        finally:
            stack.replicas[victim].proc.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
    # The gateway closed the stream: once resumed, the replica aborts the generation and frees its row.
    await wait_until(lambda: _idle(stack, victim), "the resumed replica to free the stream's row", 60)
    await wait_until(lambda: live_is(stack, set(stack.replicas)), "the resumed replica to be live", 60)


async def test_every_replica_stopped_is_504_in_openai_shape_then_503(stack: GatewayStack) -> None:
    async with httpx.AsyncClient(base_url=stack.url, headers=auth(stack), timeout=120) as c:
        with stopped(stack, *stack.replicas):
            started = time.monotonic()
            resp = await c.post("/v1/chat/completions", json={**CHAT, "max_tokens": 4})
            waited = time.monotonic() - started
            assert resp.status_code == 504, resp.text
            assert (
                resp.json()["error"]["code"] == "upstream_timeout" and int(resp.headers["retry-after"]) >= 1
            )
            assert 2 * FIRST_TOKEN_S <= waited < 2 * FIRST_TOKEN_S + 30
            streamed = await c.post("/v1/chat/completions", json={**CHAT, "max_tokens": 4, "stream": True})
            assert streamed.status_code == 503, streamed.text  # both are marked: none left to try
            assert streamed.json()["error"]["code"] == "no_replica_available"
        await wait_until(lambda: live_is(stack, set(stack.replicas)), "both replicas to be live again", 60)
        ok = await c.post("/v1/chat/completions", json={**CHAT, "max_tokens": 4})
        assert ok.status_code == 200, ok.text
    assert await reservations_returned(stack)
