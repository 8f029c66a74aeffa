"""Gateway overhead: TTFT and total time through the public gateway vs straight to the replica, side by side.

Open loop at a fixed rate against the running local stack (`make up`): each tick sends one streamed request,
alternating between the gateway (auth, alias, limits, router, SSE relay) and the replica's own generate
stream, for the same alias/adapter and prompt. Prints one JSON object with p50/p95/p99 of both and the added
TTFT (gateway minus direct). Target: +2 ms p50, +10 ms p99.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from typing import Annotated, Any

import httpx
import typer


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _summary(ttft: list[float], total: list[float]) -> dict[str, float]:
    ms = 1000.0
    return {
        "n": len(ttft),
        "ttft_p50_ms": round(_pct(ttft, 0.5) * ms, 3),
        "ttft_p95_ms": round(_pct(ttft, 0.95) * ms, 3),
        "ttft_p99_ms": round(_pct(ttft, 0.99) * ms, 3),
        "ttft_mean_ms": round(statistics.fmean(ttft) * ms, 3) if ttft else float("nan"),
        "total_p50_ms": round(_pct(total, 0.5) * ms, 3),
        "total_p99_ms": round(_pct(total, 0.99) * ms, 3),
    }


async def _timed(
    client: httpx.AsyncClient,
    url: str,
    headers: dict[str, str],
    body: dict[str, Any],
    first_marker: bytes,
) -> tuple[float, float] | None:
    """(ttft, total) of one streamed request: ttft at the first line carrying a token; None unless 200."""
    start = time.perf_counter()
    ttft = None
    async with client.stream("POST", url, json=body, headers=headers) as resp:
        if resp.status_code != 200:
            await resp.aread()
            return None
        async for line in resp.aiter_lines():
            if ttft is None and first_marker in line.encode():
                ttft = time.perf_counter() - start
    total = time.perf_counter() - start
    return (ttft if ttft is not None else total), total


async def _publish_states(replicas: dict[str, str], token: str, stop: asyncio.Event) -> None:
    """replica.state from each replica's /state, for a stack whose replicas do not publish it themselves."""
    from lorafleet.config import PlatformSettings
    from lorafleet.kafka import make_producer
    from schemas.replica_api import StateResponse

    producer = make_producer(PlatformSettings())
    await producer.start()
    try:
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as c:
            while not stop.is_set():
                for rid, url in replicas.items():
                    resp = await c.get(f"{url}/internal/replicas/{rid}/state")
                    ev = StateResponse.model_validate_json(resp.raise_for_status().content).replica_state()
                    await producer.send(ev.topic.name, ev.to_bytes(), key=ev.key().encode())
                await asyncio.sleep(0.5)
    finally:
        await producer.stop()


async def _run(
    gateway_url: str,
    api_key: str,
    alias: str,
    adapter_id: str,
    replica_id: str,
    replica_url: str,
    token: str,
    rate: float,
    duration_s: float,
    max_tokens: int,
    warmup: int,
) -> dict:
    messages = [{"role": "user", "content": "Say hi."}]
    gw = (
        f"{gateway_url}/v1/chat/completions",
        {"Authorization": f"Bearer {api_key}"},
        {"model": alias, "messages": messages, "max_tokens": max_tokens, "stream": True, "temperature": 0},
        b'"content"',
    )
    direct = (
        f"{replica_url}/internal/replicas/{replica_id}/generate",
        {"Authorization": f"Bearer {token}"},
        {"messages": messages, "adapter_id": adapter_id, "max_tokens": max_tokens, "temperature": 0},
        b'"token"',
    )
    results: dict[str, list[tuple[float, float]]] = {"gateway": [], "direct": []}
    errors = {"gateway": 0, "direct": 0}
    limits = httpx.Limits(max_connections=500, max_keepalive_connections=200)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        for _ in range(warmup):
            await _timed(client, *gw)
            await _timed(client, *direct)

        async def one(name: str, target: tuple) -> None:
            out = await _timed(client, *target)
            if out is None:
                errors[name] += 1
            else:
                results[name].append(out)

        tasks = []
        start = time.perf_counter()
        n = int(rate * duration_s)
        for i in range(n):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            name, target = ("gateway", gw) if i % 2 == 0 else ("direct", direct)
            tasks.append(asyncio.create_task(one(name, target)))
        await asyncio.gather(*tasks)
    out = {name: _summary([t for t, _ in r], [t for _, t in r]) for name, r in results.items()}
    added = {
        "ttft_p50_ms": round(out["gateway"]["ttft_p50_ms"] - out["direct"]["ttft_p50_ms"], 3),
        "ttft_p99_ms": round(out["gateway"]["ttft_p99_ms"] - out["direct"]["ttft_p99_ms"], 3),
        "total_p50_ms": round(out["gateway"]["total_p50_ms"] - out["direct"]["total_p50_ms"], 3),
    }
    return {
        "benchmark": "gateway_overhead",
        "rate_per_s": rate,
        "duration_s": duration_s,
        "max_tokens": max_tokens,
        "errors": errors,
        **out,
        "added_by_gateway": added,
        "target": {"ttft_p50_ms": 2.0, "ttft_p99_ms": 10.0},
    }


def gateway(
    rate: Annotated[float, typer.Option(help="requests per second, both paths together")] = 40.0,
    duration_s: Annotated[float, typer.Option(help="seconds of open-loop load")] = 20.0,
    max_tokens: Annotated[int, typer.Option(help="tokens per request")] = 4,
    alias: Annotated[str, typer.Option(help="alias through the gateway")] = "acme/support:prod",
    adapter_id: Annotated[
        str, typer.Option(help="the adapter id it points at (direct path)")
    ] = "acme-support-v1",
    replica_id: Annotated[str, typer.Option(help="replica for the direct path")] = "replica-0",
    replica_url: Annotated[str, typer.Option(help="its URL")] = "http://127.0.0.1:18100",
    api_key: Annotated[
        str | None, typer.Option(help="tenant key (default: .data/demo/keys.json acme)")
    ] = None,
    warmup: Annotated[int, typer.Option(help="sequential warm-up requests per path")] = 5,
    publish_state: Annotated[
        bool, typer.Option(help="publish replica.state from the replicas' /state (if they do not)")
    ] = False,
) -> None:
    """TTFT and total time through the gateway vs directly to the replica, in one run; prints JSON."""
    from gateway.config import GatewayConfig

    config = GatewayConfig.from_env()
    key = api_key or json.loads((config.platform.data_path / "demo" / "keys.json").read_text())["acme"]
    token = config.gateway.replica_service_token.get_secret_value()
    # Route everything to one replica so both paths meet the same engine.
    replicas = {replica_id: replica_url}

    async def main() -> dict:
        stop = asyncio.Event()
        publisher = asyncio.create_task(_publish_states(replicas, token, stop)) if publish_state else None
        if publisher is not None:
            await asyncio.sleep(config.gateway.replica_stale_s + 1)  # let other replicas' states go stale
        try:
            return await _run(
                config.gateway.public_base_url(),
                key,
                alias,
                adapter_id,
                replica_id,
                replica_url,
                token,
                rate,
                duration_s,
                max_tokens,
                warmup,
            )
        finally:
            stop.set()
            if publisher is not None:
                await publisher

    typer.echo(json.dumps(asyncio.run(main()), indent=2))


if __name__ == "__main__":
    typer.run(gateway)
