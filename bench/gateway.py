"""Gateway overhead: the real public gateway in front of the stand-in replica, against the stand-in directly.

For each rate (open-loop arrivals) and each repeat, one phase goes straight to the stand-in's generate
stream and one goes through the gateway (API key and alias from PostgreSQL, route from replica.state on
Kafka, SSE relay), one after the other with the same httpx client, in alternating order. The gateway's
addition is the gateway phase's percentile minus the direct phase's, per repeat, then the median over
repeats. Gateway CPU comes from /proc of its pid over the gateway phase. Prints one JSON object (its
config, environment and CPU layout included) and writes it and a PNG under --out.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer

from bench.gateway_load import Path as LoadPath
from bench.gateway_load import run_phase, summary_ms
from bench.gateway_plot import plot
from bench.gateway_stack import ADAPTER_ID, ALIAS, TOKEN, Stack, bench_stack, cpu_seconds, pick_layout

GOALS = {
    "at_rate_per_s": 40,
    "added_ttft_p50_ms": 2.0,
    "added_ttft_p99_ms": 10.0,
    "added_itl_p99_ms": 2.0,
    "gateway_cores": 0.5,
    "sustained_rate_per_s": 160,
}
ADDED = ("ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "lateness_p99_ms")


def _paths(stack: Stack, max_tokens: int) -> dict[str, LoadPath]:
    messages = [{"role": "user", "content": "Tell me a story about a fox."}]
    chat = {"model": ALIAS, "messages": messages, "max_tokens": max_tokens, "stream": True}
    generate = {"messages": messages, "adapter_id": ADAPTER_ID, "max_tokens": max_tokens}
    return {
        "direct": LoadPath(
            "direct",
            f"{stack.standin_url}/internal/replicas/{stack.replica_id}/generate",
            {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
            json.dumps(generate).encode(),
            b'"type":"token"',
        ),
        "gateway": LoadPath(
            "gateway",
            f"{stack.gateway_url}/v1/chat/completions",
            {"Authorization": f"Bearer {stack.api_key}", "Content-Type": "application/json"},
            json.dumps(chat).encode(),
            b'"content":"',
        ),
    }


async def _phase(
    client: httpx.AsyncClient, stack: Stack, path: LoadPath, rate: float, opts: dict[str, Any]
) -> dict[str, Any]:
    pids = {"gateway": stack.gateway.pid, "standin": stack.standin.pid, "load_generator": os.getpid()}
    cpu0 = {role: cpu_seconds(pid) for role, pid in pids.items()}
    load0 = os.getloadavg()[0]
    samples, wall = await run_phase(
        client, path, rate, opts["duration_s"], 1.0 / opts["token_rate"], _grace(opts)
    )
    cpu = {role: round(cpu_seconds(pid) - cpu0[role], 3) for role, pid in pids.items()}
    sent = max(1, round(rate * opts["duration_s"]))
    row: dict[str, Any] = {
        "path": path.name,
        "rate_per_s": rate,
        "requests": sent,
        "ok": len(samples.ttft),
        "errors": samples.errors,
        "tokens": samples.tokens,
        "wall_s": round(wall, 3),
        **summary_ms(samples),
        "cpu_s": cpu,
        "gateway_cores": round(cpu["gateway"] / wall, 3),
        "gateway_cpu_s_per_1k_tokens": round(1000 * cpu["gateway"] / max(1, samples.tokens), 4),
        "load_average_1m": [round(load0, 2), round(os.getloadavg()[0], 2)],
    }
    return row


def _grace(opts: dict[str, Any]) -> float:
    """How long after its last arrival a phase waits for requests: twice a request's ideal time, plus 5 s."""
    return 2 * opts["max_tokens"] / opts["token_rate"] + opts["ttft_ms"] / 1000 + 5.0


def _median(rows: list[dict[str, Any]], key: str) -> float:
    return round(statistics.median(r[key] for r in rows), 3)


def _summarize(phases: list[dict[str, Any]], rates: list[float]) -> list[dict[str, Any]]:
    """Per rate: the medians over repeats of each path, and of the gateway's per-repeat addition."""
    out = []
    for rate in rates:
        gw = [p for p in phases if p["rate_per_s"] == rate and p["path"] == "gateway"]
        direct = [p for p in phases if p["rate_per_s"] == rate and p["path"] == "direct"]
        pairs = list(zip(gw, direct, strict=True))
        row: dict[str, Any] = {"rate_per_s": rate, "repeats": len(pairs)}
        for key in ADDED:
            row[f"added_{key}"] = round(statistics.median(g[key] - d[key] for g, d in pairs), 3)
        for key in ("ttft_p50_ms", "ttft_p99_ms", "itl_p99_ms"):
            row[f"direct_{key}"] = _median(direct, key)
            row[f"gateway_{key}"] = _median(gw, key)
        row["gateway_cores"] = _median(gw, "gateway_cores")
        row["gateway_cores_while_idle"] = _median(direct, "gateway_cores")
        row["gateway_cpu_s_per_1k_tokens"] = round(
            statistics.median(g["gateway_cpu_s_per_1k_tokens"] for g in gw), 4
        )
        row["errors"] = sum(sum(p["errors"].values()) for p in gw + direct)
        row["start_lag_p99_ms"] = max(p["start_lag_p99_ms"] for p in gw + direct)
        row["load_average_1m"] = [
            min(p["load_average_1m"][0] for p in gw),
            max(p["load_average_1m"][1] for p in gw),
        ]
        out.append(row)
    return out


def _highest_passing(summary: list[dict[str, Any]], limit_ms: float) -> float | None:
    """The highest rate whose added p99 TTFT, and every lower rate's, is within limit_ms (no errors)."""
    best = None
    for row in sorted(summary, key=lambda r: r["rate_per_s"]):
        if row["added_ttft_p99_ms"] > limit_ms or row["errors"]:
            break
        best = row["rate_per_s"]
    return best


def _environment(layout_desc: dict[str, object]) -> dict[str, Any]:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    return {
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "git_commit": commit or None,
        "load_average_1m_at_start": round(os.getloadavg()[0], 2),
        "cpu_layout": layout_desc,
        "note": "a shared machine: other work runs on the same cores, so figures are noisy; compare ratios",
    }


async def run_gateway_bench(opts: dict[str, Any]) -> dict[str, Any]:
    layout = pick_layout(opts["pin"])
    if layout.load_generator is not None:
        os.sched_setaffinity(0, layout.load_generator)
    env = _environment(layout.describe())
    rates: list[float] = opts["rates"]
    phases: list[dict[str, Any]] = []
    started = time.perf_counter()
    profile = opts["out"] / "gateway.prof" if opts["profile"] else None
    async with bench_stack(
        layout, opts["token_rate"], opts["ttft_ms"], opts["out"] / "logs", profile
    ) as stack:
        paths = _paths(stack, opts["max_tokens"])
        limits = httpx.Limits(max_connections=4000, max_keepalive_connections=4000)
        async with httpx.AsyncClient(timeout=120, limits=limits) as client:
            for name in ("direct", "gateway"):  # open connections, fill the key and alias caches
                period = 1.0 / opts["token_rate"]
                await run_phase(client, paths[name], min(rates), opts["warmup_s"], period, _grace(opts))
            for repeat in range(opts["repeats"]):
                for rate in rates:
                    order = ("direct", "gateway") if repeat % 2 == 0 else ("gateway", "direct")
                    for name in order:
                        row = await _phase(client, stack, paths[name], rate, opts)
                        phases.append({"repeat": repeat, **row})
    summary = _summarize(phases, rates)
    at_goal = next((r for r in summary if r["rate_per_s"] == GOALS["at_rate_per_s"]), None)
    return {
        "benchmark": "gateway_overhead",
        "command": " ".join(["lorafleet", "bench", "gateway", *sys.argv[sys.argv.index("gateway") + 1 :]])
        if "gateway" in sys.argv
        else None,
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in opts.items()},
        "environment": env,
        "definitions": {
            "added_*": "gateway phase minus direct phase, per repeat; median over repeats",
            "ttft": "request start to the first piece of body holding a token, as the client reads it",
            "itl": "gap between successive tokens as the client reads them (0 inside one read)",
            "lateness": "a token's arrival after the first token, minus its place on the stand-in's clock",
            "gateway_cores": "gateway CPU seconds (utime+stime of its pid) over the phase's wall time",
            "highest_rate_p99_added_ttft_within_10ms": "highest rate passing, with every lower rate passing",
        },
        "goals": GOALS,
        "summary": summary,
        "highest_rate_p99_added_ttft_within_10ms": _highest_passing(summary, 10.0),
        "at_goal_rate": at_goal,
        "gateway_profile_top": _profile_top(profile) if profile is not None else None,
        "load_average_1m_at_end": round(os.getloadavg()[0], 2),
        "total_s": round(time.perf_counter() - started, 1),
        "phases": phases,
    }


def _profile_top(path: Path, n: int = 25) -> list[str]:
    """The gateway's n most expensive functions by own time (cProfile inflates every call alike)."""
    import io
    import pstats

    if not path.is_file():
        return []
    text = io.StringIO()
    pstats.Stats(str(path), stream=text).sort_stats("tottime").print_stats(n)
    (path.with_suffix(".txt")).write_text(text.getvalue())
    return [line for line in text.getvalue().splitlines() if line.strip()][-n:]


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",") if v.strip()]


def gateway(
    rates: Annotated[
        str, typer.Option(help="open-loop request rates per second, comma-separated")
    ] = "10,40,80,160",
    max_tokens: Annotated[int, typer.Option(help="tokens per request")] = 250,
    token_rate: Annotated[float, typer.Option(help="the stand-in's tokens per second per stream")] = 100.0,
    ttft_ms: Annotated[float, typer.Option(help="the stand-in's delay before a first token")] = 0.0,
    duration_s: Annotated[float, typer.Option(help="seconds of arrivals per phase")] = 6.0,
    repeats: Annotated[int, typer.Option(help="repeats of every (rate, path) phase; medians reported")] = 3,
    warmup_s: Annotated[float, typer.Option(help="unrecorded seconds at the lowest rate on each path")] = 2.0,
    pin: Annotated[bool, typer.Option(help="pin processes to cores with taskset")] = True,
    profile: Annotated[
        bool, typer.Option(help="run the gateway under cProfile (slower; gateway.prof)")
    ] = False,
    quick: Annotated[
        bool, typer.Option(help="a few seconds in all: rates 10,40, 20 tokens, 1 repeat")
    ] = False,
    out: Annotated[Path, typer.Option(help="folder for gateway.json, gateway.png and the logs")] = Path(
        ".data/bench/gateway"
    ),
) -> None:
    """The gateway's added TTFT, inter-token latency and CPU in front of the stand-in; prints JSON."""
    opts: dict[str, Any] = {
        "rates": _floats(rates),
        "max_tokens": max_tokens,
        "token_rate": token_rate,
        "ttft_ms": ttft_ms,
        "duration_s": duration_s,
        "repeats": repeats,
        "warmup_s": warmup_s,
        "pin": pin,
        "profile": profile,
        "quick": quick,
        "out": out,
    }
    if quick:
        opts |= {"rates": [10.0, 40.0], "max_tokens": 20, "token_rate": 200.0, "duration_s": 1.5}
        opts |= {"repeats": 1, "warmup_s": 0.5}
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request would load the generator
    out.mkdir(parents=True, exist_ok=True)
    result = asyncio.run(run_gateway_bench(opts))
    text = json.dumps(result, indent=2)
    (out / "gateway.json").write_text(text + "\n")
    plot(result, out / "gateway.png")
    typer.echo(text)
