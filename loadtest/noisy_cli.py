"""`lorafleet loadtest-noisy`: the noisy-neighbour scenario (loadtest.noisy) against a running deployment;
writes summary.json and requests.jsonl to the report directory and prints the summary."""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

from loadtest.noisy import NoisyConfig, run_noisy, summarise


def noisy_neighbour(
    gateway: Annotated[str, typer.Option(help="Public gateway URL.")] = "http://127.0.0.1:18080",
    quiet: Annotated[str, typer.Option(help="The quiet tenant's alias.")] = "globex/sales:prod",
    noisy: Annotated[str, typer.Option(help="The bursting tenant's alias.")] = "acme/support:prod",
    keys: Annotated[Path, typer.Option(help="JSON {tenant: api key}.")] = Path(".data/demo/keys.json"),
    rate: Annotated[float, typer.Option(help="Each tenant's usual requests/s.")] = 0.5,
    burst_factor: Annotated[float, typer.Option(help="The noisy tenant's rate over the burst.")] = 10.0,
    duration: Annotated[float, typer.Option(help="Seconds of arrivals.")] = 90.0,
    burst_start: Annotated[float, typer.Option(help="When the burst starts, s.")] = 20.0,
    burst_s: Annotated[float, typer.Option(help="How long the burst lasts, s.")] = 40.0,
    prompt_tokens: Annotated[int, typer.Option(help="Prompt words per request.")] = 32,
    output_tokens: Annotated[int, typer.Option(help="max_tokens per request.")] = 16,
    slo: Annotated[float, typer.Option(help="TTFT SLO, s.")] = 1.0,
    seed: Annotated[int, typer.Option()] = 0,
    report: Annotated[Path, typer.Option(help="Directory for summary.json and requests.jsonl.")] = Path(
        ".data/loadtest/noisy"
    ),
) -> None:
    """Two tenants, one bursting to 10x its rate: each one's TTFT over the burst."""
    cfg = NoisyConfig(
        gateway,
        quiet,
        noisy,
        json.loads(keys.read_text()),
        rate,
        burst_factor,
        duration,
        burst_start,
        burst_s,
        prompt_tokens,
        output_tokens,
        slo,
        seed,
    )
    records = asyncio.run(run_noisy(cfg))
    summary = summarise(cfg, records)
    report.mkdir(parents=True, exist_ok=True)
    with (report / "requests.jsonl").open("w") as out:
        for rec in records:
            out.write(json.dumps(asdict(rec)) + "\n")
    (report / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    typer.echo(json.dumps(summary, indent=2))
