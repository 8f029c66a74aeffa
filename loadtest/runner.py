"""Replay the shared workload (sim.workload) or a trace file (sim.trace) open-loop against a gateway."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import httpx

from loadtest.client import RequestRecord, send
from loadtest.prompts import PromptSource
from sim import trace as traces
from sim.workload import Request, WorkloadConfig, generate


@dataclass(frozen=True)
class LoadTestConfig:
    gateway: str
    models: tuple[str, ...]  # aliases, most popular first (Zipf rank i -> models[i])
    keys: dict[str, str]  # tenant -> API key; an alias's tenant is the part before its first "/"
    workload: WorkloadConfig
    timeout_s: float = 120.0
    temperature: float | None = None  # None: the server's default
    prompts: PromptSource | None = None  # real text of each request's length; None: repeated words


def model_for(req: Request, models: tuple[str, ...]) -> str:
    """The alias of the request's adapter: sim.workload numbers adapters by popularity rank."""
    return models[int(req.adapter_id.rsplit("-", 1)[1]) % len(models)]


def tenant_of(model: str) -> str:
    """An alias's tenant: the part before its first "/" (the API key a request is sent with is its)."""
    return model.split("/", 1)[0]


def key_for(model: str, keys: dict[str, str]) -> str:
    return keys[tenant_of(model)]


def trace_for(cfg: LoadTestConfig, rate: float) -> list[Request]:
    """The trace one rate replays: the workload at that rate over the configured aliases."""
    return generate(replace(cfg.workload, rate=rate, adapters=len(cfg.models)))


def replay_trace(
    path: Path, replay: traces.ReplayConfig, models: tuple[str, ...]
) -> tuple[list[Request], dict[str, object]]:
    """A trace file's replay over the aliases (raises sim.trace.TraceError for a bad file).

    A CSV's requests get an alias's rank from a Zipf mix over the aliases (replay.adapters is ignored);
    a request's tenant is its alias's tenant, the part before the first "/" (it holds the API key)."""
    source = traces.read(path)
    shaped = traces.shape(source, replace(replay, adapters=len(models)))
    shaped = [replace(r, tenant=tenant_of(model_for(r, models))) for r in shaped]
    return shaped, traces.describe(source, shaped, replay)


def prompts_for(cfg: LoadTestConfig, trace: list[Request]) -> list[str | None]:
    """The prompt text of every request (None: the client's repeated words)."""
    if cfg.prompts is None:
        return [None] * len(trace)
    return list(cfg.prompts.prompts([(r.request_id, r.prompt_tokens) for r in trace]))


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
    texts = prompts_for(cfg, trace)  # before the clock starts: tokenizing takes milliseconds a request
    async with client_for(cfg, transport) as client:

        async def one(req: Request, text: str | None, t0: float) -> RequestRecord:
            await asyncio.sleep(max(0.0, t0 + req.arrival_s - time.perf_counter()))
            model = model_for(req, cfg.models)
            rec = await send(client, req, model, key_for(model, cfg.keys), rate, text, cfg.temperature)
            on_done(rec)
            return rec

        t0 = time.perf_counter()
        return list(await asyncio.gather(*(one(r, text, t0) for r, text in zip(trace, texts, strict=True))))


async def run_rate(
    cfg: LoadTestConfig,
    rate: float,
    on_done: Callable[[RequestRecord], object] = lambda _r: None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> list[RequestRecord]:
    """Send one generated trace at `rate` requests/s."""
    return await run_trace(cfg, trace_for(cfg, rate), rate, on_done, transport)
