"""`lorafleet loadtest`: replay the shared workload through a gateway's public API at several rates and
write summary.json, requests.jsonl and report.md to the report directory."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer
from tqdm import tqdm

from loadtest.replica_metrics import per_minute, scrape
from loadtest.runner import LoadTestConfig, run_rate
from loadtest.summary import markdown, summarise
from sim.workload import WorkloadConfig

DEMO_MODELS = "acme/support:prod,acme/support:next,globex/sales:prod"


def run_loadtest(
    cfg: LoadTestConfig,
    rates: list[float],
    report: Path,
    progress: bool = True,
    replicas: list[str] | None = None,
) -> dict[str, Any]:
    """Every rate in turn; the summary is also written to report/summary.json."""
    report.mkdir(parents=True, exist_ok=True)
    summaries = []
    with (report / "requests.jsonl").open("w") as out:
        for rate in rates:
            total = int(rate * cfg.workload.duration_s)
            before, start = scrape(replicas or []), time.perf_counter()
            with tqdm(total=total, desc=f"{rate:g} req/s", disable=not progress) as bar:
                records = asyncio.run(run_rate(cfg, rate, on_done=lambda _r: bar.update()))
            for rec in records:
                out.write(json.dumps(asdict(rec)) + "\n")
            summaries.append(summarise(records, rate, cfg.workload.duration_s))
            if replicas:
                elapsed = time.perf_counter() - start
                summaries[-1]["replica_cache_per_min"] = per_minute(before, scrape(replicas), elapsed)
    summary = {
        "gateway": cfg.gateway,
        "models": list(cfg.models),
        "duration_s": cfg.workload.duration_s,
        "zipf_s": cfg.workload.zipf_s,
        "prompt_mean": cfg.workload.prompt_mean,
        "output_mean": cfg.workload.output_mean,
        "rates": summaries,
    }
    (report / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (report / "report.md").write_text(markdown(summary))
    return summary


def loadtest(
    gateway: Annotated[str, typer.Option(help="Public gateway URL.")] = "http://127.0.0.1:18080",
    rates: Annotated[str, typer.Option(help="Comma-separated request rates, req/s.")] = "1,2,4,8",
    duration: Annotated[float, typer.Option(help="Seconds of arrivals per rate.")] = 60.0,
    models: Annotated[str, typer.Option(help="Comma-separated aliases, most popular first.")] = DEMO_MODELS,
    adapters: Annotated[int, typer.Option(help="Use the first N aliases (0: all).")] = 0,
    zipf: Annotated[float, typer.Option(help="Zipf exponent over the aliases.")] = 1.0,
    prompt_mean: Annotated[float, typer.Option(help="Mean prompt tokens.")] = 750.0,
    output_mean: Annotated[float, typer.Option(help="Mean output tokens.")] = 250.0,
    keys: Annotated[Path, typer.Option(help="JSON {tenant: api key}.")] = Path(".data/demo/keys.json"),
    seed: Annotated[int, typer.Option()] = 0,
    replica: Annotated[
        list[str] | None,
        typer.Option(help="Replica URL whose /metrics give loads and evictions (repeatable)."),
    ] = None,
    report: Annotated[
        Path, typer.Option(help="Directory for summary.json, requests.jsonl, report.md.")
    ] = Path(".data/loadtest"),
) -> None:
    """Load-test a running deployment through its public API (streaming)."""
    names = tuple(m.strip() for m in models.split(",") if m.strip())
    names = names[:adapters] if adapters > 0 else names
    workload = WorkloadConfig(
        zipf_s=zipf, duration_s=duration, prompt_mean=prompt_mean, output_mean=output_mean, seed=seed
    )
    cfg = LoadTestConfig(gateway, names, json.loads(keys.read_text()), workload)
    summary = run_loadtest(cfg, [float(r) for r in rates.split(",")], report, replicas=replica)
    typer.echo(json.dumps(summary, indent=2))
