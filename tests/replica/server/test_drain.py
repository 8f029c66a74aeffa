"""GET /ready and POST /internal/drain on a real replica server (SmolLM2, a socket, the app's lifespan):
a drain refuses new requests, lets running ones finish and then reports drained; past its deadline the
requests still running end with an error line, never a cut stream."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from gateway.public.routing.policy import ReplicaLoad
from gateway.public.upstream.replica_client import ReplicaClient, ReplicaUnavailable
from replica.config import ReplicaSettings
from replica.runtime import Replica, build_replica
from replica.server import create_app
from schemas.replica_api import GenerateRequest
from tests.replica.server.serving import serving

TOKEN = "drain-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
GENERATE = "/internal/replicas/rd/generate"


@dataclass
class Served:
    replica: Replica
    client: httpx.AsyncClient
    drained: asyncio.Event


@pytest.fixture
async def served(smollm2_dir: Path, tmp_path: Path) -> AsyncIterator[Served]:
    settings = ReplicaSettings(
        replica_id="rd",
        service_token=TOKEN,
        model_dir=smollm2_dir,
        device="cpu",
        max_num_seqs=2,
        max_model_len=256,
        lora_slots={8: 1},
        registry_url=None,
        control_enabled=False,  # no control plane: ready at once, nothing placed on it
        cache_dir=tmp_path / "cache",
        lifecycle_poll_s=0.05,
    )
    replica = build_replica(settings)
    drained = asyncio.Event()
    async with (
        serving(create_app(replica, on_drained=drained.set)) as url,
        httpx.AsyncClient(base_url=url, timeout=60) as client,
    ):
        yield Served(replica, client, drained)


async def _lines(client: httpx.AsyncClient, max_tokens: int) -> list[dict]:
    body = {"prompt_token_ids": [1, 2, 3, 4], "max_tokens": max_tokens, "ignore_eos": True}
    async with client.stream("POST", GENERATE, json=body, headers=AUTH) as resp:
        assert resp.status_code == 200
        return [json.loads(line) async for line in resp.aiter_lines() if line]


async def _running(replica: Replica, n: int) -> None:
    for _ in range(200):
        if len(replica.running) >= n and replica.engine.engine.scheduler.running:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{n} requests should be running")


async def test_a_drain_refuses_new_requests_and_finishes_the_running_ones(served: Served) -> None:
    client, replica = served.client, served.replica
    assert (await client.get("/ready")).json() == {"status": "ready"}
    stream = asyncio.create_task(_lines(client, 24))
    await _running(replica, 1)

    assert (await client.post("/internal/drain")).status_code == 401  # the service token is required
    first = await client.post("/internal/drain", json={"deadline_s": 60}, headers=AUTH)
    assert first.status_code == 200
    assert first.json() == {"replica_id": "rd", "status": "draining", "in_flight": 1, "deadline_s": 60.0}
    again = await client.post("/internal/drain", json={"deadline_s": 1}, headers=AUTH)
    assert again.json()["deadline_s"] == 60.0 and again.json()["status"] == "draining"

    ready = await client.get("/ready")
    assert ready.status_code == 503 and ready.json()["error"]["code"] == "replica_not_ready"
    body = {"prompt_token_ids": [1, 2], "max_tokens": 2}
    refused = await client.post(GENERATE, json=body, headers=AUTH)
    assert refused.status_code == 503
    assert refused.json()["error"] == {
        "message": "this replica is draining; send the request to another one",
        "type": "server_error",
        "param": None,
        "code": "replica_draining",
    }
    assert not served.drained.is_set()  # the running request is not finished yet
    # The gateway's client passes a draining replica's refusal on to the next replica of its plan (here
    # none is left), never to the caller as the request's own error.
    gateway = ReplicaClient(TOKEN)
    try:
        with pytest.raises(ReplicaUnavailable):
            plan = [ReplicaLoad("rd", str(client.base_url), 0)]
            await gateway.open(plan, GenerateRequest(prompt_token_ids=[1, 2], max_tokens=2), lambda _r: None)
    finally:
        await gateway.aclose()

    lines = await stream
    assert [e["type"] for e in lines] == ["token"] * 23 + ["token", "done"]
    await asyncio.wait_for(served.drained.wait(), 10)
    assert not replica.running


async def test_requests_still_running_at_the_deadline_end_with_an_error_line(served: Served) -> None:
    client, replica = served.client, served.replica
    streams = [asyncio.create_task(_lines(client, 240)) for _ in range(2)]
    await _running(replica, 2)
    resp = await client.post("/internal/drain", json={"deadline_s": 0.5}, headers=AUTH)
    assert resp.json()["in_flight"] == 2 and resp.json()["deadline_s"] == 0.5
    for lines in await asyncio.gather(*streams):
        assert 1 <= len(lines) < 240 and all(e["type"] == "token" for e in lines[:-1])
        assert lines[-1] == {
            "type": "error",
            "error": {
                "message": "the replica is shutting down; retry the request",
                "type": "server_error",
                "param": None,
                "code": "replica_draining",
            },
        }
    await asyncio.wait_for(served.drained.wait(), 10)
    for _ in range(100):  # the engine dropped the ended requests' rows
        if not replica.engine.engine.scheduler.running:
            break
        await asyncio.sleep(0.05)
    assert not replica.engine.engine.scheduler.running
