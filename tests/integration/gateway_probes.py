"""The fault tests' gateway stack and what they read from it: live replicas, metrics, reservations."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.stacks.gateway import GatewayStack, gateway_stack, random_adapters
from tests.integration.waiting import wait_until

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def auth(stack: GatewayStack) -> dict[str, str]:
    """The bearer header of the stack's tenant acme."""
    return {"Authorization": f"Bearer {stack.keys['acme']}"}


async def live_is(stack: GatewayStack, replica_ids: set[str]) -> bool:
    """True when the gateway's /ready lists exactly these replicas as live."""
    async with httpx.AsyncClient() as c:
        return set((await c.get(f"{stack.url}/ready")).json()["replicas"]) == replica_ids


async def gateway_metrics(stack: GatewayStack) -> Samples:
    """The public /metrics as (name, sorted labels) -> value."""
    async with httpx.AsyncClient() as c:
        text = (await c.get(f"{stack.url}/metrics")).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def reservations_returned(stack: GatewayStack) -> bool:
    """True when the gateway holds no request and no token in flight."""
    m = await gateway_metrics(stack)
    return (
        m[("gateway_inflight_requests", ())] == 0
        and m[("gateway_inflight_tokens", (("pool", "default"),))] == 0
    )


@contextlib.asynccontextmanager
async def fault_stack(
    services,
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    settings: dict[str, str],
    returned_s: float,
) -> AsyncIterator[GatewayStack]:
    """A gateway and two replicas (ids <name>…a, b) with settings; yields once both are live, and on the way
    out waits up to returned_s until every reservation is returned."""
    root, base_hash = await random_adapters(tmp_path_factory.mktemp("adapters"))
    prefix = f"{name}{uuid.uuid4().hex[:6]}-"
    work = tmp_path_factory.mktemp(name)
    ids = (f"{prefix}a", f"{prefix}b")
    async with gateway_stack(services.settings(), root, base_hash, work, ids, extra_env=settings) as s:
        await wait_until(lambda: live_is(s, set(s.replicas)), "both replicas to become live", 60)
        yield s
        await wait_until(lambda: reservations_returned(s), "every reservation to be returned", returned_s)
