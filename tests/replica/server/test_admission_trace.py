"""The replica server times each admission stage of a generate request into its Prometheus histogram."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from bench.admission import one_request, stage_sums
from replica.config import ReplicaSettings
from replica.engine.trace import STAGES
from replica.runtime import Replica, build_replica
from replica.server import create_app

AUTH = {"Authorization": "Bearer t"}


@pytest.fixture(scope="module")
async def replica(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Replica]:
    settings = ReplicaSettings(
        replica_id="r1",
        service_token="t",
        model_dir=smollm2_dir,
        device="cpu",
        max_num_seqs=2,
        max_model_len=128,
        lora_slots={8: 1},
        registry_url=None,
        control_enabled=False,
        cache_dir=tmp_path_factory.mktemp("cache"),
    )
    rep = build_replica(settings)
    await rep.start()
    yield rep
    await rep.stop()


async def test_one_generate_observes_every_stage_once_within_its_wall_time(replica: Replica) -> None:
    transport = httpx.ASGITransport(app=create_app(replica))
    async with httpx.AsyncClient(transport=transport, base_url="http://replica") as c:
        before = stage_sums((await c.get("/metrics")).text)
        body = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 2, "ignore_eos": True}
        start = time.perf_counter()
        resp = await c.post("/internal/replicas/r1/generate", json=body, headers=AUTH)
        wall = time.perf_counter() - start
        assert resp.status_code == 200
        stages = one_request(before, stage_sums((await c.get("/metrics")).text))
    assert stages is not None and set(stages) == set(STAGES)
    assert stages["template"] > 0 and stages["tokenize"] > 0 and stages["prefill"] > 0
    assert sum(stages.values()) <= wall


async def test_token_id_prompts_skip_the_tokenizer(replica: Replica) -> None:
    transport = httpx.ASGITransport(app=create_app(replica))
    async with httpx.AsyncClient(transport=transport, base_url="http://replica") as c:
        before = stage_sums((await c.get("/metrics")).text)
        body = {"prompt_token_ids": [1, 2, 3], "max_tokens": 1}
        resp = await c.post("/internal/replicas/r1/generate", json=body, headers=AUTH)
        assert resp.status_code == 200
        stages = one_request(before, stage_sums((await c.get("/metrics")).text))
    assert stages is not None and stages["tokenize"] == 0.0  # both marks are set at one moment
