"""Idempotency-Key on chat completions, through the real public gateway and two real SmolLM2 replicas.

The replicas run with the fault-injection prefill delay, so a first request is still running when its
duplicate arrives.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
import uuid
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.stacks.gateway import GatewayStack, gateway_stack, random_adapters
from tests.integration.openai_errors import openai_error
from tests.integration.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CHAT = {
    "model": "acme/support:prod",
    "messages": [{"role": "user", "content": "Say hello."}],
    "max_tokens": 8,
}


@pytest.fixture(scope="module")
async def stack(services, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[GatewayStack]:
    root, base_hash = await random_adapters(tmp_path_factory.mktemp("adapters"))
    settings = {
        "LORAFLEET_REPLICA_FAULT_PREFILL_DELAY_S": "3",
        "LORAFLEET_GATEWAY_FIRST_TOKEN_TIMEOUT_S": "30",
    }
    prefix = f"idm{uuid.uuid4().hex[:6]}-"
    work = tmp_path_factory.mktemp("idempotency")
    ids = (f"{prefix}a", f"{prefix}b")
    async with gateway_stack(services.settings(), root, base_hash, work, ids, extra_env=settings) as s:
        yield s


def _headers(stack: GatewayStack, key: str, tenant: str = "acme") -> dict[str, str]:
    return {"Authorization": f"Bearer {stack.keys[tenant]}", "Idempotency-Key": key}


async def _requests_ok(stack: GatewayStack) -> float:
    async with httpx.AsyncClient() as c:
        text = (await c.get(f"{stack.url}/metrics")).text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "gateway_requests_total" and s.labels == {"status": "200"}:
                return s.value
    return 0.0


async def _running(stack: GatewayStack) -> bool:
    for rid in stack.replicas:
        st = await stack.state(rid)
        if st["queue_depth"] or st["tokens_in_flight"]:
            return True
    return False


async def _idle(stack: GatewayStack) -> bool:
    return not await _running(stack)


def _send(url: str, headers: dict[str, str], body: dict) -> socket.socket:
    """Send one request on a raw socket; the caller closes it without reading any of the answer."""
    parts = urlsplit(url)
    payload = json.dumps(body).encode()
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {parts.netloc}\r\n{head}"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    ).encode() + payload
    sock = socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 80), timeout=30)
    sock.sendall(request)
    return sock


async def test_a_dropped_answer_is_replayed_to_the_retry_without_running_again(stack: GatewayStack) -> None:
    await wait_until(lambda: _idle(stack), "the replicas to be idle", 120)
    before = await _requests_ok(stack)
    key = f"retry-{uuid.uuid4().hex}"
    sock = await asyncio.to_thread(_send, stack.url, _headers(stack, key), CHAT)
    try:
        await wait_until(lambda: _running(stack), "the request to run", 60)
    finally:
        sock.close()  # the connection is cut while the request runs: its answer is lost
    async with httpx.AsyncClient(base_url=stack.url, timeout=120) as c:
        deadline = time.monotonic() + 120
        while True:
            retry = await c.post("/v1/chat/completions", json=CHAT, headers=_headers(stack, key))
            if retry.status_code != 409 or time.monotonic() > deadline:
                break
            assert openai_error(retry)["code"] == "idempotency_in_progress"
            await asyncio.sleep(0.2)
        assert retry.status_code == 200, retry.text
        assert retry.headers["idempotent-replayed"] == "true"
        assert retry.json()["choices"][0]["message"]["content"]
        again = await c.post("/v1/chat/completions", json=CHAT, headers=_headers(stack, key))
        assert again.status_code == 200 and again.content == retry.content
    # The dropped request ran and was counted once; neither replay ran or was counted.
    assert await _requests_ok(stack) == before + 1
    assert await _idle(stack)


async def test_a_duplicate_while_running_is_409_another_body_422_another_tenant_its_own(
    stack: GatewayStack,
) -> None:
    await wait_until(lambda: _idle(stack), "the replicas to be idle", 120)
    key = f"dup-{uuid.uuid4().hex}"
    async with httpx.AsyncClient(base_url=stack.url, timeout=120) as c:
        first = asyncio.create_task(c.post("/v1/chat/completions", json=CHAT, headers=_headers(stack, key)))
        await wait_until(lambda: _running(stack), "the first request to run", 60)
        dup = await c.post("/v1/chat/completions", json=CHAT, headers=_headers(stack, key))
        assert dup.status_code == 409, dup.text
        assert openai_error(dup)["code"] == "idempotency_in_progress"
        ran = await first
        assert ran.status_code == 200 and "idempotent-replayed" not in ran.headers, ran.text
        replay = await c.post("/v1/chat/completions", json=CHAT, headers=_headers(stack, key))
        assert replay.status_code == 200 and replay.headers["idempotent-replayed"] == "true"
        assert replay.json() == ran.json()
        assert replay.headers["x-adapter-id"] == ran.headers["x-adapter-id"]

        other_body = {**CHAT, "max_tokens": 9}
        reused = await c.post("/v1/chat/completions", json=other_body, headers=_headers(stack, key))
        assert reused.status_code == 422, reused.text
        assert openai_error(reused)["code"] == "idempotency_key_reused"

        # the key is the tenant's own: another tenant's request with it runs
        theirs = {**CHAT, "model": "globex/sales:prod"}
        other = await c.post("/v1/chat/completions", json=theirs, headers=_headers(stack, key, "globex"))
        assert other.status_code == 200 and "idempotent-replayed" not in other.headers, other.text

        for bad_key in ("x" * 256, "tab\tkey"):
            bad = await c.post("/v1/chat/completions", json=CHAT, headers=_headers(stack, bad_key))
            assert bad.status_code == 400, bad.text
            assert openai_error(bad)["code"] == "invalid_idempotency_key"
        streamed = {**CHAT, "stream": True}
        refused = await c.post("/v1/chat/completions", json=streamed, headers=_headers(stack, f"s-{key}"))
        assert refused.status_code == 400, refused.text
        assert openai_error(refused)["code"] == "idempotency_not_supported_for_stream"

        # a request that fails gives its key back: the retry runs
        failing = {**CHAT, "model": "acme/nope:prod"}
        key2 = f"fail-{uuid.uuid4().hex}"
        for _ in range(2):
            missing = await c.post("/v1/chat/completions", json=failing, headers=_headers(stack, key2))
            assert missing.status_code == 404, missing.text
