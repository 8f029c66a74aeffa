"""The load test against a small OpenAI-shaped streaming server on a real socket (the full local stack's
run is an integration job): records, summary, report files."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from fastapi import FastAPI, Header, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from prometheus_client import generate_latest

from loadtest.cli import run_loadtest
from loadtest.runner import LoadTestConfig
from replica.metrics import ReplicaMetrics
from sim.workload import WorkloadConfig

KEYS = {"acme": "k-acme", "globex": "k-globex"}
TIERS = {"acme/support:prod": "gpu", "acme/support:next": "ram", "globex/sales:prod": "disk"}


def gateway_app() -> FastAPI:
    app = FastAPI()
    metrics = ReplicaMetrics("stand-in")  # the replica's real counters, served as a replica would

    @app.get("/metrics")
    async def scrape() -> PlainTextResponse:
        return PlainTextResponse(generate_latest(metrics.registry).decode())

    @app.post("/v1/chat/completions")
    async def chat(request: Request, authorization: str = Header("")):
        body = await request.json()
        tenant = body["model"].split("/")[0]
        if authorization != f"Bearer {KEYS.get(tenant)}":
            return JSONResponse({"error": {"code": "invalid_api_key"}}, status_code=401)

        if TIERS[body["model"]] != "gpu":
            metrics.loads.labels(TIERS[body["model"]], "gpu").inc()

        async def events():
            await asyncio.sleep(0.02)
            for i in range(body["max_tokens"]):
                chunk = {"choices": [{"delta": {"content": f"t{i}"}, "finish_reason": None}]}
                yield f"data: {json.dumps(chunk)}\n\n"
                await asyncio.sleep(0.002)
            yield "data: [DONE]\n\n"

        headers = {"x-adapter-tier": TIERS[body["model"]], "x-adapter-id": body["model"] + "-v1"}
        return StreamingResponse(events(), media_type="text/event-stream", headers=headers)

    return app


@pytest.fixture(scope="module")
def gateway() -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(gateway_app(), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(5)


def config(gateway: str, keys: dict[str, str]) -> LoadTestConfig:
    workload = WorkloadConfig(duration_s=2.0, prompt_mean=20, output_mean=6, zipf_s=1.0, seed=5)
    return LoadTestConfig(gateway, tuple(TIERS), keys, workload)


def test_loadtest_records_ttft_tpot_and_tier_per_request(gateway: str, tmp_path: Path) -> None:
    summary = run_loadtest(config(gateway, KEYS), [5.0, 10.0], tmp_path, progress=False, replicas=[gateway])
    records = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert len(records) == sum(s["requests"] for s in summary["rates"]) > 10
    for rec in records:
        assert rec["status"] == 200 and rec["tier"] == TIERS[rec["model"]]
        assert 0.02 <= rec["ttft_s"] <= rec["total_s"]
        assert rec["chunks"] == rec["max_tokens"]
        assert rec["chunks"] == 1 or rec["tpot_s"] > 0
    for s in summary["rates"]:
        assert s["ok"] == s["requests"]
        assert s["gpu_hit_rate"] == s["tier_share"]["gpu"]
        assert sum(s["tier_share"].values()) == pytest.approx(1.0)
        assert s["ttft"]["p50_s"] <= s["ttft"]["p95_s"]
        misses = s["requests"] - round(s["tier_share"]["gpu"] * s["requests"])
        assert (misses > 0) == (s["replica_cache_per_min"][gateway].get("gpu_loads", 0) > 0)
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    report = (tmp_path / "report.md").read_text()
    assert "| 5 |" in report and "| 10 |" in report and "TTFT by tier" in report


def test_loadtest_counts_rejected_requests(gateway: str, tmp_path: Path) -> None:
    summary = run_loadtest(
        config(gateway, {"acme": "wrong", "globex": "wrong"}), [5.0], tmp_path, progress=False
    )
    rate = summary["rates"][0]
    assert rate["ok"] == 0 and rate["statuses"] == {"401": rate["requests"]}
    assert rate["ttft"]["p50_s"] is None and rate["gpu_hit_rate"] is None
