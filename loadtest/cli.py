"""`lorafleet loadtest`: replay the shared workload through a gateway's public API at several rates (or a
trace file, sim.trace), then the distinct-adapter bursts, and write summary.json, requests.jsonl, the
traces, report.md, report.html and its PNG plots to the report directory. Prompts are real text of each
request's length (loadtest.prompts)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Annotated, Any

import typer
from tqdm import tqdm

from loadtest import plots
from loadtest.burst import BurstConfig, run_bursts
from loadtest.prompts import PromptSource, default_tokenizer
from loadtest.replica_metrics import parse_replicas, per_minute, scrape
from loadtest.runner import LoadTestConfig, replay_trace, run_trace, trace_for
from loadtest.summary import markdown, summarise
from lorafleet.profile import DEV_TOKEN
from ops import html_report
from sim import trace as traces
from sim.workload import Request, WorkloadConfig, save

DEMO_MODELS = "acme/support:prod,acme/support:next,globex/sales:prod"


def trace_rate(trace: list[Request]) -> float:
    """The mean arrival rate of a trace (requests over the span of its arrivals)."""
    span = max((r.arrival_s for r in trace), default=0.0)
    return round(len(trace) / span, 4) if span > 0 else float(len(trace))


def run_loadtest(
    cfg: LoadTestConfig,
    rates: list[float],
    report: Path,
    progress: bool = True,
    replicas: dict[str, str] | None = None,
    trace: list[Request] | None = None,
    burst: BurstConfig | None = None,
    trace_info: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Every rate in turn (or the one given trace), then the bursts; also written under report/."""
    report.mkdir(parents=True, exist_ok=True)
    summaries = []
    traces = [(trace_rate(trace), trace)] if trace is not None else [(r, trace_for(cfg, r)) for r in rates]
    with (report / "requests.jsonl").open("w") as out:
        for rate, requests in traces:
            save(requests, report / f"trace-{rate:g}.jsonl")
            before, start = scrape(replicas or {}), time.perf_counter()
            with tqdm(total=len(requests), desc=f"{rate:g} req/s", disable=not progress) as bar:
                records = asyncio.run(run_trace(cfg, requests, rate, on_done=lambda _r: bar.update()))
            for rec in records:
                out.write(json.dumps(asdict(rec)) + "\n")
            span = max((r.arrival_s for r in requests), default=0.0) if trace else cfg.workload.duration_s
            summaries.append(summarise(records, rate, span or cfg.workload.duration_s))
            if replicas:
                elapsed = time.perf_counter() - start
                summaries[-1]["replica_cache_per_min"] = per_minute(before, scrape(replicas), elapsed)
    summary: dict[str, Any] = {
        "gateway": cfg.gateway,
        "models": list(cfg.models),
        "duration_s": cfg.workload.duration_s,
        "zipf_s": cfg.workload.zipf_s,
        "prompt_mean": cfg.workload.prompt_mean,
        "output_mean": cfg.workload.output_mean,
        **({"trace": trace_info} if trace_info is not None else {}),
        "rates": summaries,
    }
    if burst is not None and burst.distinct:
        total = burst.repeats * len([d for d in burst.distinct if d <= len(cfg.models)])
        with tqdm(total=total, desc="bursts", disable=not progress) as bar:
            summary["burst"] = asyncio.run(run_bursts(cfg, burst, replicas, on_burst=bar.update))
    summary["plots"] = plots.write(summary, report)
    (report / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (report / "report.md").write_text(markdown(summary))
    html_report.write(
        report / "report.html", "Load test", summary, summary["plots"], f"Gateway {cfg.gateway}."
    )
    return summary


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(",") if v.strip())


def loadtest(
    gateway: Annotated[str, typer.Option(help="Public gateway URL.")] = "http://127.0.0.1:18080",
    rates: Annotated[str, typer.Option(help="Comma-separated request rates, req/s.")] = "1,2,4,8",
    duration: Annotated[
        float | None,
        typer.Option(help="Seconds of arrivals per rate (default 60; with --trace: the whole trace)."),
    ] = None,
    models: Annotated[str, typer.Option(help="Comma-separated aliases, most popular first.")] = DEMO_MODELS,
    adapters: Annotated[int, typer.Option(help="Use the first N aliases (0: all).")] = 0,
    zipf: Annotated[float, typer.Option(help="Zipf exponent over the aliases.")] = 1.0,
    prompt_mean: Annotated[float, typer.Option(help="Mean prompt tokens.")] = 750.0,
    output_mean: Annotated[float, typer.Option(help="Mean output tokens.")] = 250.0,
    temperature: Annotated[float | None, typer.Option(help="Sampling temperature (server default).")] = None,
    keys: Annotated[Path, typer.Option(help="JSON {tenant: api key}.")] = Path(".data/demo/keys.json"),
    seed: Annotated[int, typer.Option()] = 0,
    trace_in: Annotated[
        Path | None,
        typer.Option(
            "--trace",
            "--trace-in",
            help="Replay this trace instead of --rates: a CSV with TIMESTAMP, ContextTokens and "
            "GeneratedTokens (aliases drawn from a --zipf mix), or a sim JSONL trace.",
        ),
    ] = None,
    rate: Annotated[
        float | None,
        typer.Option(help="With --trace: rescale its time to this mean rate, req/s (default: as recorded)."),
    ] = None,
    trace_offset: Annotated[
        float, typer.Option(help="With --trace: skip this many seconds of the trace's own clock first.")
    ] = 0.0,
    tokenizer: Annotated[
        Path | None,
        typer.Option(
            exists=True,
            dir_okay=False,
            help="tokenizer.json that cuts prompts to their token counts (default: the prepared default "
            "model's; without one, lengths are estimated from words).",
        ),
    ] = None,
    setup: Annotated[
        int, typer.Option(help="First make and register N adapters for --tenant and load-test them.")
    ] = 0,
    tenant: Annotated[str, typer.Option(help="The tenant --setup creates (limits for bursts).")] = "loadtest",
    setup_rank: Annotated[int, typer.Option(help="Rank of the --setup adapters.")] = 16,
    setup_only: Annotated[bool, typer.Option(help="Stop after --setup.")] = False,
    burst: Annotated[
        str, typer.Option(help="Distinct adapters per burst, comma-separated ('' skips the bursts).")
    ] = "1,8,32",
    burst_size: Annotated[int, typer.Option(help="Concurrent requests per burst.")] = 32,
    burst_tokens: Annotated[int, typer.Option(help="max_tokens of a burst request.")] = 64,
    burst_repeats: Annotated[int, typer.Option(help="Interleaved repeats of every burst.")] = 3,
    replica: Annotated[
        list[str] | None,
        typer.Option(
            help="ID=URL of a replica: its /metrics give loads and evictions; bursts pre-warm it "
            "(repeatable)."
        ),
    ] = None,
    replica_token: Annotated[str, typer.Option(help="The replicas' service token.")] = DEV_TOKEN,
    report: Annotated[
        Path, typer.Option(help="Directory for summary.json, requests.jsonl, report.md and plots.")
    ] = Path(".data/loadtest/report"),
) -> None:
    """Load-test a running deployment through its public API (streaming)."""
    key_map = json.loads(keys.read_text()) if keys.is_file() else {}
    names = tuple(m.strip() for m in models.split(",") if m.strip())
    if setup > 0:
        from loadtest.setup import setup as make_tenant

        aliases, tenant_keys = make_tenant(setup, tenant, setup_rank)
        names, key_map = tuple(aliases), {**key_map, **tenant_keys}
        typer.echo(f"{len(aliases)} adapters ready for tenant {tenant}: {','.join(aliases)}")
        if setup_only:
            return
    names = names[:adapters] if adapters > 0 else names
    workload = WorkloadConfig(
        zipf_s=zipf,
        duration_s=60.0 if duration is None else duration,
        prompt_mean=prompt_mean,
        output_mean=output_mean,
        seed=seed,
    )
    cfg = LoadTestConfig(gateway, names, key_map, workload, temperature=temperature)
    bursts = BurstConfig(_ints(burst), burst_size, burst_tokens, burst_repeats, replica_token)
    trace, info = None, None
    if trace_in is not None:
        replay = traces.ReplayConfig(rate or 0.0, duration or 0.0, trace_offset, len(names), zipf, 0, seed)
        try:
            trace, info = replay_trace(trace_in, replay, names)
        except traces.TraceError as exc:
            raise typer.BadParameter(str(exc), param_hint="--trace") from None
        if not trace:
            raise typer.BadParameter(f"{trace_in}: no request in the window", param_hint="--trace")
        cfg = replace(cfg, workload=replace(workload, duration_s=max(r.arrival_s for r in trace)))
    cfg = replace(cfg, prompts=PromptSource(seed, tokenizer or default_tokenizer()))
    rate_list = [float(r) for r in rates.split(",") if r.strip()]
    replicas = parse_replicas(replica or [])
    summary = run_loadtest(cfg, rate_list, report, True, replicas, trace, bursts, info)
    typer.echo(json.dumps({k: v for k, v in summary.items() if k != "models"}, indent=2))
