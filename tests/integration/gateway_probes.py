"""What fault tests read from a running gateway stack: its live replicas, its metrics, its reservations."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.gateway_stack import GatewayStack

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
