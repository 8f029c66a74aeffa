"""The edge under attack: quiet tenants' time to first token with and without a hostile neighbour.

One real public gateway in front of the stand-in replica (bench/gateway_stack.py). A quiet tenant sends
open-loop streaming chats at --rate for --duration-s, in two kinds of phase, alternating their order over
--repeats:

- quiet: nothing else;
- attacked: at the same time a slowloris client holds --slowloris connections, each sending its headers a
  byte every --trickle-s (it reconnects whenever the gateway cuts one), and a noisy tenant sends chats at
  10 times its request limit (--noisy-limit per second).

The result is the quiet tenant's p95 TTFT under attack over the quiet phase's, per repeat, and its median;
goal at most 1.2. The gateway runs with a short header deadline (--header-timeout-s) so the run sees cuts.
Prints one JSON object.

    .venv/bin/python -m lorafleet.cli bench edge [--repeats 3] [--out .data/bench/edge.json]
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

import httpx
import typer

from bench.gateway_load import Path as LoadPath
from bench.gateway_load import PhaseSamples, pct, run_phase
from bench.gateway_stack import ALIAS, Stack, bench_stack, pick_layout
from harness.seed import Tenant

GOAL_RATIO = 1.2
NOISY = "noisy"


@dataclass
class Attack:
    """What the hostile side did in one phase."""

    cut: int = 0  # slowloris connections the gateway closed
    opened: int = 0
    noisy: dict[str, int] = field(default_factory=dict)  # the noisy tenant's answers by status


def _chat(url: str, key: str, max_tokens: int) -> LoadPath:
    messages = [{"role": "user", "content": "Tell me a story about a fox."}]
    body = {"model": ALIAS, "messages": messages, "max_tokens": max_tokens, "stream": True}
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    return LoadPath("chat", f"{url}/v1/chat/completions", headers, json.dumps(body).encode(), b'"content":"')


async def _slowloris(
    url: str, connections: int, trickle_s: float, stop: asyncio.Event, attack: Attack
) -> None:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80

    async def one() -> None:
        while not stop.is_set():
            try:
                reader, writer = await asyncio.open_connection(host, port)
            except OSError:
                await asyncio.sleep(trickle_s)
                continue
            attack.opened += 1
            try:
                writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
                while not stop.is_set():
                    writer.write(b"X")
                    await writer.drain()
                    with contextlib.suppress(TimeoutError):
                        if await asyncio.wait_for(reader.read(1), trickle_s) == b"":
                            attack.cut += 1
                            break
            except (ConnectionError, OSError):
                attack.cut += 1
            finally:
                writer.close()

    await asyncio.gather(*(one() for _ in range(connections)))


async def _noisy(
    client: httpx.AsyncClient, path: LoadPath, rate: float, duration_s: float, attack: Attack
) -> None:
    async def one() -> None:
        try:
            async with client.stream("POST", path.url, content=path.body, headers=path.headers) as resp:
                await resp.aread()
                key = str(resp.status_code)
        except httpx.HTTPError as exc:
            key = type(exc).__name__
        attack.noisy[key] = attack.noisy.get(key, 0) + 1

    begin, tasks = time.perf_counter(), []
    for i in range(max(1, round(rate * duration_s))):
        delay = begin + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one()))
    await asyncio.gather(*tasks)


def _row(kind: str, samples: PhaseSamples, attack: Attack | None) -> dict[str, Any]:
    row: dict[str, Any] = {
        "phase": kind,
        "ok": len(samples.ttft),
        "errors": samples.errors,
        "ttft_p50_ms": round(pct(samples.ttft, 0.50) * 1000, 3),
        "ttft_p95_ms": round(pct(samples.ttft, 0.95) * 1000, 3),
        "ttft_p99_ms": round(pct(samples.ttft, 0.99) * 1000, 3),
    }
    if attack is not None:
        row |= {"slowloris_opened": attack.opened, "slowloris_cut": attack.cut, "noisy_answers": attack.noisy}
    return row


async def _phase(stack: Stack, opts: dict[str, Any], attacked: bool) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client, httpx.AsyncClient(timeout=60) as noisy:
        quiet = _chat(stack.gateway_url, stack.api_key, opts["max_tokens"])
        grace = 2 * opts["max_tokens"] / opts["token_rate"] + 10
        measured = run_phase(client, quiet, opts["rate"], opts["duration_s"], 1 / opts["token_rate"], grace)
        if not attacked:
            samples, _ = await measured
            return _row("quiet", samples, None)
        attack, stop = Attack(), asyncio.Event()
        loris = asyncio.create_task(
            _slowloris(stack.gateway_url, opts["slowloris"], opts["trickle_s"], stop, attack)
        )
        noisy_path = _chat(stack.gateway_url, stack.keys[NOISY], opts["max_tokens"])
        flood = asyncio.create_task(
            _noisy(noisy, noisy_path, 10 * opts["noisy_limit"], opts["duration_s"], attack)
        )
        await asyncio.sleep(opts["trickle_s"])  # the slow connections are open before the measured requests
        samples, _ = await measured
        stop.set()
        await asyncio.gather(loris, flood)
        return _row("attacked", samples, attack)


async def run(opts: dict[str, Any], logs: Path) -> dict[str, Any]:
    others = (Tenant(NOISY, float(opts["noisy_limit"]), 2_000_000_000),)
    gateway_env = {"LORAFLEET_HTTP_HEADER_TIMEOUT_S": str(opts["header_timeout_s"])}
    layout = pick_layout(pin=False)
    phases = []
    async with bench_stack(
        layout, opts["token_rate"], opts["ttft_ms"], logs, others=others, gateway_env=gateway_env
    ) as stack:
        await _phase(stack, {**opts, "duration_s": 3}, attacked=False)  # warm the caches and connections
        for repeat in range(opts["repeats"]):
            order = (False, True) if repeat % 2 == 0 else (True, False)
            pair = {}
            for attacked in order:
                row = await _phase(stack, opts, attacked)
                pair[row["phase"]] = row
            phases.append(pair)
    ratios = [p["attacked"]["ttft_p95_ms"] / p["quiet"]["ttft_p95_ms"] for p in phases]
    return {
        "bench": "edge",
        "config": opts,
        "phases": phases,
        "ttft_p95_ratio_per_repeat": [round(r, 3) for r in ratios],
        "ttft_p95_ratio_median": round(statistics.median(ratios), 3),
        "goal_ratio_at_most": GOAL_RATIO,
        "note": "stand-in replica (no model): the gateway's share of TTFT only; CPU times on this machine",
    }


def edge(
    rate: Annotated[float, typer.Option(help="the quiet tenant's chats per second")] = 10.0,
    duration_s: Annotated[float, typer.Option(help="each phase's length")] = 20.0,
    repeats: Annotated[int, typer.Option(help="quiet/attacked pairs, alternating order")] = 3,
    slowloris: Annotated[int, typer.Option(help="slow-header connections held")] = 200,
    trickle_s: Annotated[float, typer.Option(help="seconds between two header bytes")] = 0.5,
    header_timeout_s: Annotated[float, typer.Option(help="the gateway's header deadline")] = 2.0,
    noisy_limit: Annotated[float, typer.Option(help="the noisy tenant's requests/s; it sends 10x")] = 5.0,
    max_tokens: Annotated[int, typer.Option()] = 16,
    token_rate: Annotated[float, typer.Option(help="the stand-in's tokens/s per stream")] = 50.0,
    ttft_ms: Annotated[float, typer.Option(help="the stand-in's time to first token")] = 20.0,
    out: Annotated[Path | None, typer.Option(help="also write the JSON here")] = None,
) -> None:
    """Quiet tenants' p95 TTFT with a slowloris client and a tenant at 10x its limit, against a quiet run."""
    opts = {k: v for k, v in locals().items() if k != "out"}
    logs = Path(".data/bench/edge-logs")
    logs.mkdir(parents=True, exist_ok=True)
    result = asyncio.run(run(opts, logs))
    text = json.dumps(result, indent=2)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
    typer.echo(text)
