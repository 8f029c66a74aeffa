"""Replay the shared workload (sim.workload) open-loop against a gateway, one rate after another."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import httpx

from loadtest.client import RequestRecord, send
from sim.workload import Request, WorkloadConfig, generate


@dataclass(frozen=True)
class LoadTestConfig:
    gateway: str
    models: tuple[str, ...]  # aliases, most popular first (Zipf rank i -> models[i])
    keys: dict[str, str]  # tenant -> API key; an alias's tenant is the part before its first "/"
    workload: WorkloadConfig
    timeout_s: float = 120.0
    temperature: float | None = None  # None: the server's default


def model_for(req: Request, models: tuple[str, ...]) -> str:
    """The alias of the request's adapter: sim.workload numbers adapters by popularity rank."""
    return models[int(req.adapter_id.rsplit("-", 1)[1]) % len(models)]


def key_for(model: str, keys: dict[str, str]) -> str:
    return keys[model.split("/", 1)[0]]


def trace_for(cfg: LoadTestConfig, rate: float) -> list[Request]:
    """The trace one rate replays: the workload at that rate over the configured aliases."""
    return generate(replace(cfg.workload, rate=rate, adapters=len(cfg.models)))


def client_for(cfg: LoadTestConfig, transport: httpx.AsyncBaseTransport | None = None) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    return httpx.AsyncClient(base_url=cfg.gateway, timeout=cfg.timeout_s, limits=limits, transport=transport)


async def run_trace(
    cfg: LoadTestConfig,
    trace: list[Request],
    rate: float,
    on_done: Callable[[RequestRecord], object] = lambda _r: None,  # its result is ignored
    transport: httpx.AsyncBaseTransport | None = None,
) -> list[RequestRecord]:
    """Send a trace: each request leaves at its arrival time, whatever came before (open loop)."""
    async with client_for(cfg, transport) as client:

        async def one(req: Request, t0: float) -> RequestRecord:
            await asyncio.sleep(max(0.0, t0 + req.arrival_s - time.perf_counter()))
            model = model_for(req, cfg.models)
            rec = await send(client, req, model, key_for(model, cfg.keys), rate, temperature=cfg.temperature)
            on_done(rec)
            return rec

        t0 = time.perf_counter()
        return list(await asyncio.gather(*(one(r, t0) for r in trace)))


async def run_rate(
    cfg: LoadTestConfig,
    rate: float,
    on_done: Callable[[RequestRecord], object] = lambda _r: None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> list[RequestRecord]:
    """Send one generated trace at `rate` requests/s."""
    return await run_trace(cfg, trace_for(cfg, rate), rate, on_done, transport)
