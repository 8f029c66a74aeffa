"""The load test against a small OpenAI-shaped streaming server on a real socket (the run against the real
local stack is tests/integration/test_loadtest_stack.py): records, summary, report files, plots, bursts."""

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

from loadtest.burst import BurstConfig, measure, prewarm_order, run_bursts
from loadtest.cli import run_loadtest
from loadtest.client import RequestRecord
from loadtest.runner import LoadTestConfig
from loadtest.summary import markdown
from replica.metrics import ReplicaMetrics
from sim.workload import WorkloadConfig, generate

KEYS = {"acme": "k-acme", "globex": "k-globex"}
TIERS = {"acme/support:prod": "gpu", "acme/support:next": "ram", "globex/sales:prod": "disk"}


def adapter_of(model: str) -> str:
    return model.replace("/", "-").replace(":", "-") + "-v1"


PREWARMS: list[tuple[str, str]] = []  # (replica id, adapter id) in the order the stand-in was asked


def gateway_app() -> FastAPI:
    app = FastAPI()
    metrics = ReplicaMetrics("stand-in")  # the replica's real counters, served as a replica would

    @app.post("/internal/replicas/{replica_id}/adapters/{adapter_id}/load")
    async def load(replica_id: str, adapter_id: str, authorization: str = Header("")) -> JSONResponse:
        if authorization != "Bearer replica-token":
            return JSONResponse({"error": {"code": "unauthorized"}}, status_code=401)
        PREWARMS.append((replica_id, adapter_id))
        return JSONResponse({"adapter_id": adapter_id, "tier": "gpu"})

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
            if (body.get("stream_options") or {}).get("include_usage"):
                usage = {"prompt_tokens": 30, "completion_tokens": body["max_tokens"], "total_tokens": 0}
                yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        headers = {"x-adapter-tier": TIERS[body["model"]], "x-adapter-id": adapter_of(body["model"])}
        return StreamingResponse(events(), media_type="text/event-stream", headers=headers)

    return app


@pytest.fixture(scope="module")
def gateway() -> Iterator[str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # the server is handed this socket: no window for another to take the port
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(gateway_app(), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        assert thread.is_alive(), "the stand-in gateway should start"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(5)
    sock.close()


def config(gateway: str, keys: dict[str, str]) -> LoadTestConfig:
    workload = WorkloadConfig(duration_s=2.0, prompt_mean=20, output_mean=6, zipf_s=1.0, seed=5)
    return LoadTestConfig(gateway, tuple(TIERS), keys, workload)


def test_loadtest_records_ttft_tpot_and_tier_per_request(gateway: str, tmp_path: Path) -> None:
    replicas = {"stand-in": gateway}
    summary = run_loadtest(config(gateway, KEYS), [5.0, 10.0], tmp_path, progress=False, replicas=replicas)
    records = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert len(records) == sum(s["requests"] for s in summary["rates"]) > 10
    for rec in records:
        assert rec["status"] == 200 and rec["tier"] == TIERS[rec["model"]]
        assert 0.02 <= rec["ttft_s"] <= rec["total_s"]
        assert rec["chunks"] == rec["max_tokens"]
        assert rec["chunks"] == 1 or rec["tpot_s"] > 0
        assert rec["usage_completion_tokens"] == rec["max_tokens"] and rec["usage_prompt_tokens"] == 30
    for s in summary["rates"]:
        assert s["ok"] == s["requests"]
        assert s["gpu_hit_rate"] == s["tier_share"]["gpu"]
        assert sum(s["tier_share"].values()) == pytest.approx(1.0)
        assert s["ttft"]["p50_s"] <= s["ttft"]["p95_s"]
        misses = s["requests"] - round(s["tier_share"]["gpu"] * s["requests"])
        assert (misses > 0) == (s["replica_cache_per_min"]["stand-in"].get("gpu_loads", 0) > 0)
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    report = (tmp_path / "report.md").read_text()
    assert "| 5 |" in report and "| 10 |" in report and "TTFT by tier" in report
    for png in ("ttft.png", "tpot.png", "hit_rates.png", "cache_per_min.png"):
        assert f"]({png})" in report and (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (tmp_path / "report.html").read_text()  # the same numbers as one page, plots beside it
    assert "<title>Load test</title>" in page and "<h2>rates</h2>" in page
    for png in summary["plots"]:
        assert f'<img src="{png}"' in page
    assert f'<td class="n">{summary["rates"][1]["requests"]}</td>' in page
    traces = sorted(p.name for p in tmp_path.glob("trace-*.jsonl"))
    assert traces == ["trace-10.jsonl", "trace-5.jsonl"]


def test_a_saved_trace_replays_request_for_request(gateway: str, tmp_path: Path) -> None:
    trace = generate(
        WorkloadConfig(adapters=3, rate=8.0, duration_s=1.5, prompt_mean=10, output_mean=4, seed=2)
    )
    summary = run_loadtest(config(gateway, KEYS), [], tmp_path, progress=False, trace=trace)
    records = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert [(r["request_id"], r["arrival_s"], r["trace_adapter"], r["max_tokens"]) for r in records] == [
        (r.request_id, r.arrival_s, r.adapter_id, r.output_tokens) for r in trace
    ]
    assert len(summary["rates"]) == 1 and summary["rates"][0]["requests"] == len(trace)


def test_loadtest_counts_rejected_requests(gateway: str, tmp_path: Path) -> None:
    summary = run_loadtest(
        config(gateway, {"acme": "wrong", "globex": "wrong"}), [5.0], tmp_path, progress=False
    )
    rate = summary["rates"][0]
    assert rate["ok"] == 0 and rate["statuses"] == {"401": rate["requests"]}
    assert rate["ttft"]["p50_s"] is None and rate["gpu_hit_rate"] is None


def test_prewarm_leaves_each_replica_its_own_share_last() -> None:
    order = prewarm_order(["a0", "a1", "a2", "a3", "a4"], ["r0", "r1"])
    assert order == {"r0": ["a1", "a3", "a0", "a2", "a4"], "r1": ["a0", "a2", "a4", "a1", "a3"]}
    assert prewarm_order(["a0"], ["r0", "r1"]) == {"r0": ["a0"], "r1": ["a0"]}


def test_a_burst_record_divides_by_the_wall_time_it_reports() -> None:
    records = [
        RequestRecord(j, 0.0, "m", 8, 5, status=200, tier="gpu", usage_completion_tokens=5) for j in range(6)
    ]
    # 0.0415 s would be reported as 0.042 s if rounded: 30 tokens over it read 714, not 723 tokens/s
    run = measure(records, 0.0415)
    assert run["wall_s"] == 0.0415 and run["tokens_per_s"] == 30 / 0.0415
    assert measure([], 0.0)["tokens_per_s"] is None


def test_bursts_measure_each_distinct_count_after_a_prewarm(gateway: str) -> None:
    PREWARMS.clear()
    burst = BurstConfig((1, 3, 8), size=6, max_tokens=5, repeats=2, replica_token="replica-token", settle_s=0)
    result = asyncio.run(run_bursts(config(gateway, KEYS), burst, {"r0": gateway, "r1": gateway}))
    assert set(result["tokens_per_s"]) == {"1", "3"}  # 8 is more than the 3 aliases
    for d in ("1", "3"):
        assert len(result["runs"][d]) == 2
        for run in result["runs"][d]:
            assert run["ok"] == 6 and run["output_tokens"] == 6 * 5
            assert run["wall_s"] >= 0.02 + 5 * 0.002  # no burst is faster than one stand-in stream
            assert run["tokens_per_s"] == run["output_tokens"] / run["wall_s"]
    assert result["ratio_to_1_adapter"]["1"] == 1.0 and result["ratio_to_base"] is None
    head = {"gateway": gateway, "models": list(TIERS), "duration_s": 2.0, "zipf_s": 1.0, "rates": []}
    report = markdown({**head, "burst": result})
    tps, ratio = result["tokens_per_s"]["3"], result["ratio_to_1_adapter"]["3"]
    assert f"| 3 | {tps:.2f} | {ratio:.3f} |" in report  # the report rounds; the numbers stay exact
    ids = [adapter_of(m) for m in TIERS]
    one, three = prewarm_order(ids[:1], ["r0", "r1"]), prewarm_order(ids, ["r0", "r1"])
    for rid in ("r0", "r1"):  # before every burst, in order: 1 adapter, 3 adapters, twice
        assert [a for r, a in PREWARMS if r == rid] == (one[rid] + three[rid]) * 2
