"""The control loop on the real stack, nothing injected by hand: traffic through the public API -> the
gateway's requests.completed -> the stats stream's adapter.stats windows -> the placement worker's owners ->
replica.commands -> the replicas' tiers and replica.state -> the router spreading the adapter's traffic; and
back to the default owner count when the traffic stops."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import asyncpg
import httpx
import pytest

from harness.stacks.scaleup import (
    ADAPTERS,
    ScaleupConfig,
    ScaleupStack,
    scaleup_stack,
    wait_for,
)
from schemas.events import RequestCompleted, parse_event
from schemas.topics import REQUESTS_COMPLETED
from tests.integration.kafka_helpers import collect

pytestmark = [pytest.mark.integration, pytest.mark.slow]

HOT = next(iter(ADAPTERS))  # acme-scale-a
CONFIG = ScaleupConfig(
    max_num_seqs=4,
    unmanaged=2,
    max_replicas=2,
    stats_min_replicas=2,
    queue_per_replica=1000,  # this test is about owners, not the fleet's size
    env={
        "LORAFLEET_PLACEMENT_DEFAULT_OWNERS": "1",
        # a CPU replica's own scale: a few streams of SmolLM2 are far past 2 tok/s, one replica's "capacity"
        "LORAFLEET_PLACEMENT_REPLICA_CAPACITY_TOKENS_PER_S": "2",
        "LORAFLEET_PLACEMENT_GPU_TOKENS_PER_S": "0.5",
        "LORAFLEET_PLACEMENT_DEMAND_TTL_S": "8",
        "LORAFLEET_PLACEMENT_DECAY_CHECK_S": "1",
        "LORAFLEET_PLACEMENT_MERGE_TOKENS_PER_S": "1000000",  # no merged replica in this test
    },
)


async def _owners(stack: ScaleupStack) -> set[str]:
    conn = await asyncpg.connect(stack.platform.database_url)
    try:
        rows = await conn.fetch(
            "SELECT replica_id FROM placements WHERE adapter_id = $1 AND role = 'owner'", HOT
        )
        return {r["replica_id"] for r in rows}
    finally:
        await conn.close()


async def _holds(stack: ScaleupStack, index: int) -> bool:
    state = await stack.state(index)
    return state is not None and HOT in (*state.gpu_adapters, *state.ram_adapters)


async def test_a_hot_adapter_gains_owners_its_traffic_spreads_and_it_falls_back_when_traffic_stops(
    services, tmp_path: Path
) -> None:
    async with scaleup_stack(services.settings(), tmp_path, CONFIG) as stack:
        stack.start_replica(1)
        await wait_for(lambda: stack.all_ready(2), 180, "both replicas ready", stack)
        await wait_for(lambda: _one_owner(stack), 60, f"{HOT} placed on one owner", stack)

        stop = asyncio.Event()
        request_ids: list[str] = []
        failures: list[str] = []

        async def client() -> None:
            headers = {"Authorization": f"Bearer {stack.key}"}
            body = {
                "model": ADAPTERS[HOT],
                "messages": [{"role": "user", "content": "Count."}],
                "max_tokens": 12,
            }
            async with httpx.AsyncClient(base_url=stack.gateway_url, headers=headers, timeout=120) as c:
                while not stop.is_set():
                    resp = await c.post("/v1/chat/completions", json=body)
                    if resp.status_code != 200:
                        failures.append(resp.text)
                        continue
                    request_ids.append(resp.headers["x-request-id"])

        clients = [asyncio.create_task(client()) for _ in range(4)]
        try:
            await wait_for(
                lambda: _owners_are(stack, {stack.replica_id(0), stack.replica_id(1)}),
                120,
                f"{HOT} to gain a second owner from its traffic",
                stack,
            )
            await wait_for(lambda: _holds(stack, 1), 60, "the new owner to hold the adapter", stack)
            await wait_for(lambda: _holds(stack, 0), 60, "the first owner to still hold it", stack)
            spread_from = len(request_ids)
            await wait_for(lambda: len(request_ids) >= spread_from + 24, 120, "24 more requests", stack)
        finally:
            stop.set()
            await asyncio.gather(*clients)
        assert not failures, failures[:3]

        served = await _served_by(stack, set(request_ids[spread_from:]))
        assert set(served.values()) == {stack.replica_id(0), stack.replica_id(1)}, (
            served
        )  # the router spreads

        # Traffic stops: once its windows age out, the worker's decay check returns it to one owner.
        await wait_for(lambda: _one_owner(stack), 90, f"{HOT} back to the default owner count", stack)


async def _owners_are(stack: ScaleupStack, want: set[str]) -> bool:
    return await _owners(stack) == want


async def _one_owner(stack: ScaleupStack) -> bool:
    return len(await _owners(stack)) == 1


async def _served_by(stack: ScaleupStack, request_ids: set[str]) -> dict[str, str]:
    """request id -> the replica that served it, from the gateway's own requests.completed records."""

    def mine(r) -> bool:  # noqa: ANN001
        return json.loads(r.value).get("request_id") in request_ids

    records = await collect(
        stack.env["LORAFLEET_KAFKA_BOOTSTRAP"],
        REQUESTS_COMPLETED.name,
        lambda rs: len(rs) >= len(request_ids),
        accept=mine,
    )
    out = {}
    for r in records:
        event = parse_event(r.value, REQUESTS_COMPLETED.name)
        if isinstance(event, RequestCompleted) and event.replica_id is not None:
            out[event.request_id] = event.replica_id
    return out
