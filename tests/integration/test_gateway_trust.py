"""What the public gateway trusts, end to end: a real replica registers its address and is routed to;
forged replica.state messages (an unknown replica, or a registered id at another address) are ignored,
logged and counted, and never receive a request."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator

import httpx
import pytest

from harness.ports import free_port
from harness.stacks.gateway import ADAPTERS, GatewayStack, gateway_stack, random_adapters
from lorafleet.kafka import make_producer
from schemas.events import AliasChanged, ReplicaState
from tests.integration.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# This run's own replica ids: other stacks' gateways on the same Kafka must never see the forged states
# as their replicas' (an older gateway would route to them).
PREFIX = f"gwtrust-{uuid.uuid4().hex[:8]}-"
REAL, EVIL = PREFIX + "a", PREFIX + "evil"
SERVICE_TOKEN = "trust-test-service-token"


@pytest.fixture(scope="module")
async def stack(services, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[GatewayStack]:
    root, base_hash = await random_adapters(tmp_path_factory.mktemp("adapters"))
    work = tmp_path_factory.mktemp("gw")
    env = {
        "LORAFLEET_GATEWAY_REPLICA_ID_PREFIX": PREFIX,
        "LORAFLEET_GATEWAY_SERVICE_TOKEN": SERVICE_TOKEN,
        "LORAFLEET_GATEWAY_TENANT_METRICS_PORT": str(free_port()),
        "LORAFLEET_GATEWAY_TENANT_METRICS_MAX": "1",  # one tenant of its own, the rest "other"
    }
    async with gateway_stack(services.settings(), root, base_hash, work, (REAL,), env) as s:
        await wait_until(lambda: _live(s, {REAL}), "the registered replica to become live", 60)
        yield s


async def _live(stack: GatewayStack, replica_ids: set[str]) -> bool:
    async with httpx.AsyncClient() as c:
        return set((await c.get(f"{stack.url}/ready")).json()["replicas"]) == replica_ids


@contextlib.asynccontextmanager
async def _bait() -> AsyncIterator[list[bytes]]:
    """A listener that records the first bytes of every connection it gets (it should get none)."""
    seen: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await reader.read(4096))
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    seen.append(str(server.sockets[0].getsockname()[1]).encode())  # seen[0] is the port
    try:
        yield seen
    finally:
        server.close()
        await server.wait_closed()


async def _forge(bootstrap: str, states: list[ReplicaState], stop: asyncio.Event) -> None:
    """Publish the forged states every 0.2 s (fresher than any real one) until stop, each signed with a
    replica key of the forger's own (as another replica would sign)."""
    from lorafleet.config import PlatformSettings
    from lorafleet.state_signature import SIGNATURE_HEADER, sign, state_key

    own_key = state_key("an identity key of the forger's own, not the replica's")
    producer = make_producer(PlatformSettings(kafka_bootstrap=bootstrap))
    await producer.start()
    try:
        while not stop.is_set():
            for state in states:
                fresh = ReplicaState(**state.model_dump(exclude={"occurred_at", "event_id"}))
                value, key = fresh.to_bytes(), fresh.key().encode()
                signed = [(SIGNATURE_HEADER, sign(own_key, value))]
                await producer.send_and_wait(fresh.topic.name, value, key=key, headers=signed)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.2)
    finally:
        await producer.stop()


async def test_forged_replica_states_are_ignored_logged_and_counted(stack: GatewayStack) -> None:
    async with _bait() as seen:
        bait_url = f"http://127.0.0.1:{seen[0].decode()}"
        real_url = stack.replicas[REAL].url
        forged = [
            ReplicaState(replica_id=EVIL, url=bait_url, gpu_adapters=list(ADAPTERS), gpu_slots=8),
            ReplicaState(replica_id=REAL, url=bait_url, gpu_adapters=list(ADAPTERS), gpu_slots=8),
            # the real replica's id and address, speaking for it: draining, so the router would drop it
            ReplicaState(replica_id=REAL, url=real_url, status="draining"),
        ]
        stop = asyncio.Event()
        forger = asyncio.create_task(_forge(stack.env["LORAFLEET_KAFKA_BOOTSTRAP"], forged, stop))
        try:
            async with httpx.AsyncClient(headers={"Authorization": f"Bearer {stack.keys['acme']}"}) as c:
                await wait_until(lambda: _rejected(stack, "url_mismatch"), "the forged states to arrive", 30)
                await wait_until(lambda: _rejected(stack, "bad_signature"), "the signed-by-another state", 30)
                for _ in range(6):
                    resp = await c.post(
                        f"{stack.url}/v1/chat/completions",
                        json={"model": "acme/support:prod", "messages": [{"role": "user", "content": "Hi"}]}
                        | {"max_tokens": 2},
                        timeout=60,
                    )
                    assert resp.status_code == 200, resp.text
                assert await _live(stack, {REAL})
        finally:
            stop.set()
            await forger
        assert seen[1:] == []  # not one connection: no token, no prompt
    assert await _rejected(stack, "unregistered") and await _rejected(stack, "url_mismatch")
    assert await _rejected(stack, "bad_signature")
    log = stack.gateway_log.read_text()
    assert f"ignoring replica.state of {EVIL!r}" in log and bait_url in log


async def _rejected(stack: GatewayStack, reason: str) -> bool:
    async with httpx.AsyncClient() as c:
        text = (await c.get(f"{stack.url}/metrics")).text
    prefix = f'gateway_replica_states_rejected_total{{reason="{reason}"}} '
    return any(line.startswith(prefix) and float(line.split()[1]) > 0 for line in text.splitlines())


async def test_a_forged_alias_change_does_not_move_the_alias(stack: GatewayStack) -> None:
    """aliases.changed only makes the gateway read the row again: the row, not the event, decides."""
    from lorafleet.config import PlatformSettings

    body = {"model": "acme/support:prod", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {stack.keys['acme']}"}) as c:
        before = await c.post(f"{stack.url}/v1/chat/completions", json=body, timeout=60)
        assert before.headers["x-adapter-id"] == "acme-support-v1"
        forged = AliasChanged(
            alias="acme/support:prod", tenant_id="acme", adapter_id="acme-support-v2", revision=987_654
        )
        producer = make_producer(PlatformSettings(kafka_bootstrap=stack.env["LORAFLEET_KAFKA_BOOTSTRAP"]))
        await producer.start()
        try:
            await producer.send_and_wait(forged.topic.name, forged.to_bytes(), key=forged.key().encode())
        finally:
            await producer.stop()

        async def consumed() -> bool:
            return "(revision 987654): read again" in stack.gateway_log.read_text()

        await wait_until(consumed, "the gateway to consume the forged aliases.changed", 30)
        after = await c.post(f"{stack.url}/v1/chat/completions", json=body, timeout=60)
        assert after.status_code == 200 and after.headers["x-adapter-id"] == "acme-support-v1"


async def test_public_metrics_name_no_tenant_and_the_tenant_listener_needs_the_token(
    stack: GatewayStack,
) -> None:
    body = {"model": "acme/support:prod", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    async with httpx.AsyncClient(timeout=60) as c:
        for tenant, alias in (("acme", "acme/support:prod"), ("globex", "globex/sales:prod")):
            for _ in range(4):  # globex's 2 requests/s: some of these are refused, counted per tenant too
                resp = await c.post(
                    f"{stack.url}/v1/chat/completions",
                    json=body | {"model": alias},
                    headers={"Authorization": f"Bearer {stack.keys[tenant]}"},
                )
                assert resp.status_code in (200, 429), resp.text

        public = (await c.get(f"{stack.url}/metrics")).text
        assert "gateway_requests_total" in public and "gateway_time_to_first_token_seconds" in public
        assert "acme" not in public and "globex" not in public and "tenant=" not in public

        tenants_url = f"http://127.0.0.1:{stack.env['LORAFLEET_GATEWAY_TENANT_METRICS_PORT']}/metrics"
        for headers in (
            {},
            {"Authorization": "Bearer wrong"},
            {"Authorization": f"Bearer {stack.keys['acme']}"},
        ):
            denied = await c.get(tenants_url, headers=headers)
            assert denied.status_code == 401 and denied.json()["error"]["code"] == "invalid_service_token"
        tenants = await c.get(tenants_url, headers={"Authorization": f"Bearer {SERVICE_TOKEN}"})
        assert tenants.status_code == 200
        # bounded: the first tenant seen has its own series, every later one is "other"
        assert 'tenant="acme"' in tenants.text and 'tenant="other"' in tenants.text
        assert "globex" not in tenants.text
