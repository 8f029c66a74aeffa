"""Nothing leaks, after traffic from two tenants that succeeds, fails in every way a caller can make it fail,
and loses its replica mid-stream (SIGKILL), and after refused internal API calls: the processes' log files
and every error the callers got hold no tenant's prompt text, no API key (valid or not), no service token
and no signed URL's signature; and when the stack stops, no process it started (the gateway, the internal
API, the replicas, their children) is left running."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from pathlib import Path

import httpx
import psutil
import pytest

from harness.adapters import make_peft_adapters
from harness.stacks.gateway import ADAPTERS, ADMIN_TOKEN, TOKEN, GatewayStack, gateway_stack
from lorafleet.model.prepare import ensure_default_model
from tests.integration.internal_api_proc import InternalApi, internal_api
from tests.integration.openai_errors import openai_error
from tests.integration.services import ServiceAddresses
from tests.integration.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ALIASES = {"acme": "acme/support:prod", "globex": "globex/sales:prod"}


class Traffic:
    """The secrets sent and the error texts received."""

    def __init__(self, stack: GatewayStack) -> None:
        self.stack = stack
        self.markers = {t: f"LEAKMARK{t.upper()}{uuid.uuid4().hex[:12]}" for t in ALIASES}
        self.wrong_key = "sk-lf-wrong" + uuid.uuid4().hex
        self.errors: list[str] = []
        self.statuses: dict[int, int] = {}
        self.extra_secrets: list[str] = []

    def secrets(self) -> list[str]:
        return [
            *self.markers.values(),
            *self.stack.keys.values(),
            self.wrong_key,
            TOKEN,
            ADMIN_TOKEN,
            *self.extra_secrets,
        ]

    def body(self, tenant: str, **fields: object) -> dict[str, object]:
        prompt = f"{self.markers[tenant]} Tell me about cats."
        return {
            "model": ALIASES[tenant],
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 3,
        } | (fields)

    async def send(self, key: str, body: dict[str, object]) -> None:
        async with httpx.AsyncClient(base_url=self.stack.url, timeout=120) as c:
            resp = await c.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})
        self.statuses[resp.status_code] = self.statuses.get(resp.status_code, 0) + 1
        if resp.status_code >= 400:
            openai_error(resp)
            self.errors.append(resp.text)
        elif body.get("stream"):
            self.errors += [line for line in resp.text.splitlines() if "error" in line]


async def _every_kind_of_request(t: Traffic, tenant: str) -> None:
    key, other = t.stack.keys[tenant], next(x for x in ALIASES if x != tenant)
    long_prompt = [{"role": "user", "content": f"{t.markers[tenant]} " * 2500}]
    for body in (
        t.body(tenant),
        t.body(tenant, stream=True),
        t.body(tenant, temperature=5),  # 400 invalid_parameter
        t.body(tenant, model=f"{tenant}/nothing:prod"),  # 404
        t.body(tenant, model=ALIASES[other]),  # another tenant's alias: 404
        t.body(tenant, messages=long_prompt),  # 400 context_length_exceeded
        t.body(tenant, max_tokens=10**9),  # over the token limit: 400
    ):
        await t.send(key, body)
    await t.send(t.wrong_key, t.body(tenant))  # 401
    await t.send(f"{key[:-2]}xx", t.body(tenant))  # 401, a near miss of a real key


async def _busy_replica(stack: GatewayStack) -> str | None:
    for rid in stack.replicas:
        state = await stack.state(rid)
        if state["queue_depth"] or state["tokens_in_flight"]:
            return rid
    return None


async def _kill_a_replica_mid_stream(t: Traffic) -> None:
    """A marker stream from acme whose replica is SIGKILLed after its first chunk."""
    key = t.stack.keys["acme"]
    async with httpx.AsyncClient(base_url=t.stack.url, timeout=120) as c:
        body = t.body("acme", stream=True, max_tokens=400)
        async with c.stream(
            "POST", "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
        ) as r:
            assert r.status_code == 200
            lines, killed = [], False
            async for line in r.aiter_lines():
                lines.append(line)
                if not killed and line.startswith("data:"):
                    victim: list[str] = []

                    async def busy(found: list[str] = victim) -> bool:
                        rid = await _busy_replica(t.stack)
                        if rid is not None:
                            found.append(rid)
                        return rid is not None

                    await wait_until(busy, "the streaming request's replica", 30)
                    proc = t.stack.replicas[victim[0]].proc
                    assert proc is not None
                    os.kill(proc.pid, signal.SIGKILL)
                    killed = True
    assert any(line.startswith("event: error") for line in lines), lines[-5:]
    t.errors += [line for line in lines if "error" in line]


async def _internal_requests(t: Traffic, api: InternalApi, token: str) -> None:
    """The internal API: a wrong service token (a secret too), registrations carrying a signed URL and a
    marker, and a move of acme's alias to globex's adapter, each refused."""
    signed = f"s3://lorafleet-adapters/adapters/acme/x?X-Amz-Signature={t.markers['acme']}"
    registration = {
        "adapter_id": "acme-leak", "tenant_id": "acme", "version": 1, "base_model_hash": "sha256:" + "0" * 64,
        "rank": 8, "alpha": 16, "target_modules": ["q_proj"], "weights_uri": signed,
        "checksum": "sha256:" + "1" * 64,
    }  # fmt: skip
    async with httpx.AsyncClient(base_url=api.url, timeout=60) as c:
        for auth, method, path, body in (
            (t.wrong_key, "GET", "/internal/adapters", None),
            (token, "POST", "/internal/adapters", registration),
            (token, "POST", "/internal/adapters", registration | {"weights_uri": t.markers["globex"]}),
            (token, "PUT", "/internal/aliases/acme/support:prod", {"adapter_id": "globex-sales-v1"}),
        ):
            resp = await c.request(method, path, json=body, headers={"Authorization": f"Bearer {auth}"})
            assert 400 <= resp.status_code < 500, (path, resp.status_code, resp.text[:300])
            openai_error(resp)
            t.errors.append(resp.text)


def _processes(stack: GatewayStack, api: InternalApi) -> list[psutil.Process]:
    """Every process the stack started, with their children, while they run."""
    roots = [stack.gateway, api.proc, *(r.proc for r in stack.replicas.values())]
    found = []
    for proc in roots:
        if proc is not None and proc.poll() is None:
            parent = psutil.Process(proc.pid)
            found += [parent, *parent.children(recursive=True)]
    return found


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def test_no_prompt_key_or_token_leaks_and_no_process_outlives_the_stack(
    services: ServiceAddresses, tmp_path: Path
) -> None:
    model_dir = ensure_default_model()
    from lorafleet.model.base_hash import base_model_hash

    base_hash = base_model_hash(model_dir)
    await asyncio.to_thread(make_peft_adapters, model_dir, tmp_path / "adapters", list(ADAPTERS), base_hash)
    async with gateway_stack(services.settings(), tmp_path / "adapters", base_hash, tmp_path) as stack:
        t = Traffic(stack)
        internal_token = "sk-internal-" + uuid.uuid4().hex
        t.extra_secrets.append(internal_token)
        for tenant in ALIASES:
            await _every_kind_of_request(t, tenant)
        # globex may send 2 requests a second: a burst of 6 is partly refused with 429
        await asyncio.gather(*(t.send(stack.keys["globex"], t.body("globex")) for _ in range(6)))
        await _kill_a_replica_mid_stream(t)
        await t.send(stack.keys["globex"], t.body("globex"))  # served by the survivor, or refused cleanly
        async with internal_api(stack, internal_token, tmp_path) as api:
            await _internal_requests(t, api, internal_token)
            started = _processes(stack, api)
        logs = [stack.gateway_log, api.log, *(r.log for r in stack.replicas.values())]
    assert {200, 400, 401, 404, 429} <= set(t.statuses), t.statuses
    assert len(t.errors) >= 20, t.errors
    for text in t.errors:
        for secret in t.secrets():
            assert secret not in text, (secret[:12], text[:300])
    for log in logs:
        content = log.read_text(errors="replace")
        assert content, log
        for secret in t.secrets():
            assert secret not in content, (log.name, secret[:12])
    assert len(started) >= 2
    left = [p for p in started if _running(p)]
    assert not left, [(p.pid, p.name()) for p in left]
