"""`lorafleet bench fleet`: the brief's fleet on real processes with calibrated stand-in replicas.

The run's own stack (bench/fleet_stack.py): tenants in its database, the internal API, the registry
validator, the relay, the placement worker, the stats stream, two public gateways sharing Redis and one
process hosting K stand-ins that time tokens like a GPU replica (bench/standin_host.py). The adapters and
their aliases are registered through the internal API (bench/fleet_register.py). Once the validator has
passed them all and the placements are in, the trace is
replayed through both gateways (loadtest's replay: --rate, --duration, a Zipf mix over the aliases), half
the requests each. Part-way a replica joins, later it is killed (bench/fleet_join.py). The stand-ins' clock
runs --slow times slower than the wall (default: 40 req/s over --rate), so the fleet sees the brief's load
per replica at a rate two cores carry; times to first token are reported in the model's seconds (wall / slow).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Annotated, Any

import asyncpg
import httpx
import typer

from bench.fleet_join import join, kill
from bench.fleet_probe import LagProbe, Series, owners, rates, sample_loop
from bench.fleet_register import register_fleet
from bench.fleet_scrape import alias_lookups, route_counts, route_shares, statements, window_lateness
from bench.fleet_sim import agreement, hit_slices, simulate_run
from bench.fleet_stack import (
    SERVICE_TOKEN,
    FleetConfig,
    FleetStack,
    alias_name,
    fleet_adapters,
    fleet_stack,
    groups,
)
from loadtest.client import RequestRecord
from loadtest.prompts import PromptSource, default_tokenizer
from loadtest.runner import LoadTestConfig, replay_trace, run_trace
from loadtest.summary import pcts, summarise
from lorafleet.config import PlatformSettings
from sim import trace as traces
from sim.workload import Request, WorkloadConfig

BRIEF_RATE = 40.0
STATS_WINDOW_S = 60.0  # the stats stream's default window (LORAFLEET_STATS_WINDOW_S), which the stack keeps
DEFAULT_TRACE = Path("/work/shared/traces/azure_conv_2023.csv")


async def _placed(pool: asyncpg.Pool, replicas: int, timeout_s: float) -> int:
    """Wait until the owner placements cover every replica and then stop changing for three seconds (the
    placement worker has counted the whole fleet in); how many there are."""
    deadline, last, stable = time.monotonic() + timeout_s, frozenset[tuple[str, str]](), 0
    while time.monotonic() < deadline and stable < 6:
        now = await owners(pool)
        full = len({rid for _, rid in now}) >= replicas
        stable = stable + 1 if full and now == last else 0
        last = now
        await asyncio.sleep(0.5)
    return len(last)


async def _register(stack: FleetStack) -> dict[str, float]:
    """Every adapter of the run registered, validated and aliased through the internal API."""
    from gateway.config import GatewayConfig
    from gateway.registry.served_base import served_base_hash, served_model_dir

    settings = GatewayConfig.from_env().gateway
    model_dir, base_hash = served_model_dir(settings), served_base_hash(settings)
    adapters = fleet_adapters(stack.cfg)
    return await register_fleet(
        stack.internal_url,
        SERVICE_TOKEN,
        stack.stack.platform,
        model_dir,
        base_hash,
        adapters,
        stack.stack.work,
    )


async def _replay(
    stack: FleetStack, keys: dict[str, str], trace: list[Request], rate: float
) -> list[RequestRecord]:
    """Each gateway sends every other request of the trace, both on one clock."""
    models = tuple(alias_name(r, stack.cfg.tenants) for r in range(stack.cfg.adapters))
    prompts = PromptSource(0, stack.cfg.tokenizer)
    cfg = LoadTestConfig(stack.gateways[0], models, keys, WorkloadConfig(), timeout_s=300.0, prompts=prompts)
    halves = [trace[i :: len(stack.gateways)] for i in range(len(stack.gateways))]
    runs = [run_trace(replace(cfg, gateway=g), h, rate) for g, h in zip(stack.gateways, halves, strict=True)]
    return [rec for part in await asyncio.gather(*runs) for rec in part]


async def _routes_after(client: httpx.AsyncClient, gateways: list[str], delay_s: float) -> dict[str, int]:
    """The gateways' route counts delay_s from now (the end of the warm-up)."""
    await asyncio.sleep(delay_s)
    return await route_counts(client, gateways)


async def _contents(client: httpx.AsyncClient, stack: FleetStack) -> list[tuple[str, dict[str, list[str]]]]:
    """Each stand-in's id with its GPU slots and RAM now, for the simulator to start from."""
    out = []
    for i, url in enumerate(stack.standin_urls):
        resp = await client.get(f"{url}/cache", timeout=10.0)
        resp.raise_for_status()
        out.append((stack.replica_id(i), resp.json()))
    return out


def _arrived_after(row: dict[str, Any], key: str, wall_s: float) -> list[float]:
    """A stand-in report's times to first token (row[key]: [arrival, time] pairs in model seconds) of the
    requests that arrived after wall_s on the wall clock."""
    return [t for a, t in row[key] if row["t0_unix"] + a * row["slow"] >= wall_s]


def _model_time(records: list[RequestRecord], slow: float) -> list[RequestRecord]:
    """Times in the stand-ins' model seconds."""
    return [
        replace(
            r,
            ttft_s=r.ttft_s / slow if r.ttft_s >= 0 else r.ttft_s,
            tpot_s=r.tpot_s / slow if r.tpot_s >= 0 else r.tpot_s,
        )
        for r in records
    ]


async def run_fleet(
    platform: PlatformSettings,
    work: Path,
    cfg: FleetConfig,
    trace: list[Request],
    rate: float,
    join_at: float,
    kill_at: float,
    quiet_s: float = 5.0,
    warmup_s: float = 0.0,
) -> dict[str, Any]:
    """Bring the stack up, wait for the first plan, replay the trace with a join and a kill; the report. The
    requests of the first warmup_s (wall seconds of the replay) run but are left out of the summary and the
    simulator's report: the fleet's caches start from registration, not from traffic."""
    async with fleet_stack(platform, work, cfg) as stack:
        pool = await asyncpg.create_pool(stack.stack.platform.database_url, min_size=1, max_size=3)
        lag = LagProbe(platform, groups(stack.run, [stack.replica_id(i) for i in range(cfg.replicas)]))
        await lag.start()
        series, stop = Series(), asyncio.Event()
        scraper = httpx.AsyncClient()
        tasks: list[asyncio.Task[Any]] = []  # what runs beside the replay, ended whatever happens
        try:
            registration = await _register(stack)
            placed = await _placed(pool, cfg.replicas, 600.0)
            await asyncio.sleep(3 * cfg.state_interval_s)  # the gateways have the replicas' latest states
            pids = {name: p.proc.pid for name, p in stack.stack.procs.items() if p.proc is not None}
            pids["bench-client"] = os.getpid()  # the load client (and the probes) run in this process
            database_url = stack.stack.platform.database_url
            database = database_url.rsplit("/", 1)[-1].split("?")[0]
            statements_before = await statements(database_url, database)
            start = await _contents(scraper, stack)
            t0, t0_unix = time.monotonic(), time.time()
            sampler = asyncio.create_task(sample_loop(lag, pool, database, pids, t0, series, stop))
            closes = asyncio.create_task(window_lateness(scraper, stack.stats_url, STATS_WINDOW_S, stop))
            replay = asyncio.create_task(_replay(stack, stack.stack.keys, trace, rate))
            routed_at_warmup = asyncio.create_task(_routes_after(scraper, stack.gateways, warmup_s))
            tasks += [sampler, closes, replay, routed_at_warmup]
            events: dict[str, Any] = {}
            span = max((r.arrival_s for r in trace), default=0.0)
            if join_at > 0:
                await asyncio.sleep(max(join_at * span - (time.monotonic() - t0), 0.0))
                events["join"] = await join(stack, pool, quiet_s, 120.0)
            if kill_at > 0 and join_at > 0:
                await asyncio.sleep(max(kill_at * span - (time.monotonic() - t0), 0.0))
                events["kill"] = await kill(stack, pool, quiet_s, 120.0)
            records = await replay
            elapsed = time.monotonic() - t0
            statements_after = await statements(database_url, database)
            aliases = await alias_lookups(scraper, stack.gateways)
            routes = route_shares(await routed_at_warmup, await route_counts(scraper, stack.gateways))
            run = stack.run
            stop.set()
            await sampler
            windows = await closes
        finally:
            stop.set()
            for task in tasks:  # a join, a kill or the replay that raised leaves the others running
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await lag.stop()
            await pool.close()
            await scraper.aclose()
    counted = [r for r in records if r.arrival_s >= warmup_s]
    summary = summarise(_model_time(counted, cfg.slow), rate, max(span - warmup_s, 1.0))
    simulated = simulate_run(cfg, trace, STATS_WINDOW_S, start, warmup_s)
    found: dict[str, int] = {}  # the stand-ins' own count of the tiers they found, written as they stop
    ttfts: list[float] = []  # and their own times to first token, of the requests after the warm-up
    model_ttfts: list[float] = []  # the same on the model's schedule, however late each loop ran
    counted_from = t0_unix + warmup_s
    for path in (work / "standin-host.json", work / "standin-joiner.json"):
        with contextlib.suppress(OSError, ValueError):
            for row in json.loads(path.read_text()):
                for tier, n in row["found"].items():
                    found[tier] = found.get(tier, 0) + n
                ttfts.extend(_arrived_after(row, "ttft_s", counted_from))
                model_ttfts.extend(_arrived_after(row, "model_ttft_s", counted_from))
    return {
        "benchmark": "fleet",
        "run": run,
        "config": {
            **asdict(cfg),
            "calibration": [str(p) for p in cfg.calibration],
            "tokenizer": None if cfg.tokenizer is None else cfg.tokenizer.parent.name,  # the model's folder
            "rate": rate,
            "warmup_s": warmup_s,
        },
        "time_note": f"the stand-ins' clock runs {cfg.slow:g}x slower than the wall; TTFT and TPOT are model "
        f"seconds (wall / {cfg.slow:g}), so the fleet sees {rate * cfg.slow:g} req/s of the brief's load",
        "registration": registration,
        "owner_placements_at_start": placed,
        "summary": summary,
        "standin_tiers": found,
        # arrival at a stand-in to its first token, model seconds, for the requests that reached one after the
        # warm-up: the model's queue and loads, and how late its host's loop wrote the token; model_schedule:
        # the first without the second
        "standin_ttft": {"count": len(ttfts), **pcts(ttfts), "model_schedule": pcts(model_ttfts)},
        "simulator": {
            "agreement": agreement(summary, simulated, pcts(model_ttfts).get("p95_s")),
            "note": "the simulator on the same trace, sizes, routing and timing, in model seconds, from the "
            "stand-ins' GPU and RAM contents when the replay began; it has no join or kill",
            "tier_share": simulated["tier_share"],
            "ttft": simulated["ttft"],
            "route_reasons": simulated["route_reasons"],
            "gpu_hit_over_time": simulated["gpu_hit_over_time"],
        },
        # by slices of the replay after the warm-up, wall seconds of arrival
        "gpu_hit_over_time": hit_slices([(r.arrival_s, r.tier) for r in counted], warmup_s, span),
        # the gateways' routing decisions after the warm-up (gateway_routes_total): the run's side of
        # simulator.route_reasons
        "routes": routes,
        "alias_cache": aliases,
        "stats_windows": {
            "window_s": STATS_WINDOW_S,
            "closed": windows,
            "late_s_max": max((w["late_s"] for w in windows), default=None),
        },
        "postgres_statements_per_s": None
        if statements_before is None or statements_after is None
        else round((statements_after - statements_before) / max(elapsed, 1e-9), 2),
        "events": events,
        **rates(series),
        "series": {"lag": series.lag, "postgres_transactions": series.xacts, "cpu_s": series.cpu},
    }


def fleet(
    out: Annotated[Path, typer.Option(help="writes fleet.json, fleet.html and its plots here")] = Path(
        "bench/results/fleet"
    ),
    trace_path: Annotated[
        Path, typer.Option("--trace", help="the arrival trace (CSV or sim JSONL)")
    ] = DEFAULT_TRACE,
    rate: Annotated[float, typer.Option(help="requests/s sent through the two gateways")] = BRIEF_RATE,
    duration: Annotated[float, typer.Option(help="seconds of trace replayed")] = 600.0,
    offset: Annotated[float, typer.Option(help="seconds of the trace's own clock skipped first")] = 0.0,
    adapters: Annotated[int, typer.Option()] = 5000,
    tenants: Annotated[int, typer.Option()] = 50,
    replicas: Annotated[int, typer.Option(help="stand-in replicas at the start (one more joins)")] = 26,
    zipf: Annotated[float, typer.Option(help="Zipf exponent of adapter popularity")] = 0.9,
    seed: Annotated[int, typer.Option()] = 0,
    routing: Annotated[str, typer.Option(help="cost | affinity | random")] = "cost",
    slow: Annotated[float | None, typer.Option(help="stand-in clock slow-down (default 40 / rate)")] = None,
    gpu_slots: Annotated[int, typer.Option()] = 250,
    state_interval_s: Annotated[float, typer.Option(help="replica.state period (wall seconds)")] = 1.0,
    calibration: Annotated[list[Path] | None, typer.Option(help="timing calibration files")] = None,
    join_at: Annotated[float, typer.Option(help="share of the run when a replica joins (0: none)")] = 0.4,
    kill_at: Annotated[float, typer.Option(help="share of the run when it is killed (0: never)")] = 0.7,
    warmup: Annotated[
        float, typer.Option(help="replay seconds served but left out of the figures (within --duration)")
    ] = 0.0,
) -> None:
    """Replay a trace on a fleet of calibrated stand-ins behind two real gateways: JSON and HTML."""
    from bench._util import emit
    from bench.fleet_plot import write_report
    from lorafleet.config import get_settings

    cfg = FleetConfig(
        adapters=adapters,
        tenants=tenants,
        replicas=replicas,
        routing=routing,
        slow=slow if slow is not None else max(BRIEF_RATE / rate, 1.0),
        state_interval_s=state_interval_s,
        gpu_slots=gpu_slots,
        calibration=tuple(calibration or ()),
        tokenizer=default_tokenizer(),
    )
    models = tuple(alias_name(r, tenants) for r in range(adapters))
    replay = traces.ReplayConfig(rate, duration, offset, adapters, zipf, 0, seed)
    trace, info = replay_trace(trace_path, replay, models)
    work = Path(tempfile.mkdtemp(prefix="lorafleet-fleet-"))
    result = asyncio.run(run_fleet(get_settings(), work, cfg, trace, rate, join_at, kill_at, warmup_s=warmup))
    result["trace"] = {"path": str(trace_path), "zipf": zipf, "seed": seed, **info}
    result["logs"] = str(work)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fleet.json").write_text(json.dumps(result, indent=1) + "\n")
    write_report(result, out)
    emit({k: v for k, v in result.items() if k != "series"})
