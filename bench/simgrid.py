"""`lorafleet bench simgrid`: the fleet simulator over a grid of adapter counts, Zipf exponents and rates.

Each cell generates one trace, sizes the fleet with the simulator's --find-replicas search (cost routing,
the gateway's default: the fewest replicas whose p95 TTFT is within the SLO), and runs every routing mode
on that trace and fleet: cost, table (a fixed score table, GIE's LoRA-affinity manner), affinity and random
(the baseline). Cells run in parallel processes.

With --trace, every cell replays one trace file (sim.trace: its arrivals rescaled to the cell's rate, so its
bursts keep their shape, and its prompt and answer lengths) with the cell's adapters drawn from its Zipf
mix, instead of generating Poisson arrivals with log-normal lengths.

slot_bound is the GPU hit rate a fleet of that many slots could reach at best if every adapter took one
slot and traffic were stationary: the popularity of the replicas x gpu_slots most popular adapters. A
cell's goal (GPU hit >= hit_goal, p95 TTFT < the SLO) is in reach only where the bound clears it.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import typer

from ops import html_report
from sim import report
from sim import trace as traces
from sim.cli import find_replicas
from sim.replica import CacheSizes
from sim.simulator import SimConfig, simulate
from sim.timing import TimingModel
from sim.workload import Request, WorkloadConfig, generate, zipf_weights

# the default (it sizes each fleet), a fixed score table, owners by load, the baseline
MODES = ("cost", "table", "affinity", "random")
SIZED_BY = "cost"


@dataclass(frozen=True)
class GridConfig:
    adapters: tuple[int, ...] = (2000, 5000, 10000)
    zipf: tuple[float, ...] = (0.8, 1.0, 1.2)
    rates: tuple[float, ...] = (20.0, 40.0, 80.0)
    duration_s: float = 300.0
    warmup_s: float = 60.0
    seed: int = 0
    slo_p95_ttft_s: float = 1.0
    hit_goal: float = 0.95
    gpu_slots: int = CacheSizes.gpu_slots
    trace: str = ""  # a trace file every cell replays; "" generates each cell's workload


@dataclass(frozen=True)
class Cell:
    adapters: int
    zipf: float
    rate: float


def slot_bound(adapters: int, zipf: float, slots: int) -> float:
    """Share of the traffic on the `slots` most popular adapters."""
    return sum(zipf_weights(adapters, zipf)[: max(slots, 0)])


def first_guess(timing: TimingModel, rate: float, trace: list[Request]) -> tuple[int, int]:
    """(a fleet that misses the SLO, one that should hold it): the brief's GPU arithmetic on the trace's mean
    lengths, x 1 and x 1.35."""
    count = max(len(trace), 1)
    prompt_mean = sum(r.prompt_tokens for r in trace) / count
    output_mean = sum(r.output_tokens for r in trace) / count
    needed = rate * (output_mean / timing.decode_tokens_per_s() + prompt_mean / timing.prefill_tokens_per_s)
    return max(math.floor(needed), 1), max(math.ceil(needed * 1.35), 2)


@functools.cache
def _read_trace(path: str) -> list[Request]:
    """The trace file, read once per process however many cells replay it."""
    return traces.read(Path(path))


def cell_trace(cell: Cell, grid: GridConfig) -> list[Request]:
    """The cell's arrivals: the grid's trace file replayed at the cell's rate, or a generated workload."""
    if grid.trace:
        replay = traces.ReplayConfig(cell.rate, grid.duration_s, 0.0, cell.adapters, cell.zipf, 0, grid.seed)
        return traces.shape(_read_trace(grid.trace), replay)
    workload = WorkloadConfig(
        adapters=cell.adapters, rate=cell.rate, zipf_s=cell.zipf, duration_s=grid.duration_s, seed=grid.seed
    )
    return generate(workload)


def run_cell(cell: Cell, grid: GridConfig) -> dict[str, Any]:
    """Size the fleet for one cell, then run every routing mode on its trace."""
    start = time.perf_counter()
    trace = cell_trace(cell, grid)
    timing = TimingModel()
    lo, hi = first_guess(timing, cell.rate, trace)
    cfg = SimConfig(
        replicas=hi,
        routing=SIZED_BY,
        sizes=CacheSizes(gpu_slots=grid.gpu_slots),
        warmup_s=grid.warmup_s,
        seed=grid.seed,
    )
    found = find_replicas(cfg, timing, trace, grid.slo_p95_ttft_s, 0.0, lo=lo)
    replicas = found["replicas"]
    runs = {SIZED_BY: found["report"]}
    for mode in MODES:
        if mode not in runs:
            runs[mode] = report.build(simulate(replace(cfg, replicas=replicas, routing=mode), timing, trace))
    bound = slot_bound(cell.adapters, cell.zipf, replicas * grid.gpu_slots)
    modes = report.compare({m: runs[m] for m in MODES})
    for mode in MODES:
        modes[mode]["probe"] = runs[mode]["probe"]
        modes[mode]["goal_met"] = _goal_met(modes[mode], grid)
    return {
        **asdict(cell),
        "requests": runs[SIZED_BY]["requests"],
        "sized_by": SIZED_BY,
        "span_s": round(max((r.arrival_s for r in trace), default=0.0), 1),
        "replicas": replicas,
        "sizing": found["tried"],
        "slot_bound": round(bound, 4),
        "goal_in_reach": bound >= grid.hit_goal,
        "modes": modes,
        "wall_s": round(time.perf_counter() - start, 1),
    }


def _goal_met(mode: dict[str, Any], grid: GridConfig) -> bool:
    p95 = mode["p95_ttft_s"]
    return mode["gpu_hit_rate"] >= grid.hit_goal and p95 is not None and p95 < grid.slo_p95_ttft_s


def _run_cell(args: tuple[Cell, GridConfig]) -> dict[str, Any]:
    return run_cell(*args)


def run_grid(grid: GridConfig, jobs: int) -> dict[str, Any]:
    """Every cell (in parallel processes when jobs > 1), then a summary per routing mode."""
    start = time.perf_counter()
    load_before = os.getloadavg()
    cells = [Cell(a, z, r) for a, z, r in itertools.product(grid.adapters, grid.zipf, grid.rates)]
    work = [(c, grid) for c in cells]
    if jobs > 1:
        with ProcessPoolExecutor(jobs) as pool:
            results = list(pool.map(_run_cell, work))
    else:
        results = [_run_cell(w) for w in work]
    return {
        "config": {**asdict(grid), "jobs": jobs, "modes": list(MODES)},
        "cells": results,
        "summary": summarize(results),
        "wall_s": round(time.perf_counter() - start, 1),
        "load_average_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
    }


def summarize(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """Per mode: cells that meet the goal (all, and of those where it is in reach), worst hit, worst p95."""
    reach = [c for c in cells if c["goal_in_reach"]]
    out: dict[str, Any] = {"cells": len(cells), "goal_in_reach": len(reach)}
    for mode in MODES:
        rows = [c["modes"][mode] for c in cells]
        out[mode] = {
            "goal_met": sum(r["goal_met"] for r in rows),
            "goal_met_in_reach": sum(c["modes"][mode]["goal_met"] for c in reach),
            "min_gpu_hit_rate": min(r["gpu_hit_rate"] for r in rows),
            "max_p95_ttft_s": max(r["p95_ttft_s"] or 0.0 for r in rows),
        }
    return out


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(v) for v in text.split(",") if v.strip())


def simgrid(
    adapters: str = typer.Option("2000,5000,10000", help="adapter counts, comma-separated"),
    zipf: str = typer.Option("0.8,1.0,1.2", help="Zipf exponents, comma-separated"),
    rates: str = typer.Option("20,40,80", help="requests per second, comma-separated"),
    duration: float = typer.Option(300.0, help="simulated seconds of arrivals per cell"),
    warmup: float = typer.Option(60.0, help="seconds of each cell left out of its report"),
    seed: int = typer.Option(0),
    slo_p95_ttft: float = typer.Option(1.0, help="p95 TTFT target that sizes each cell's fleet, s"),
    jobs: int = typer.Option(os.cpu_count() or 1, help="cells simulated in parallel processes"),
    trace: Path | None = typer.Option(
        None,
        "--trace",
        help="replay this CSV (TIMESTAMP, ContextTokens, GeneratedTokens) in each cell at its rate",
    ),
    out_dir: Path = typer.Option(
        Path("bench/results"), help="writes simgrid.json, .png and .html here (simgrid-trace.* with --trace)"
    ),
) -> None:
    """Cost vs table vs affinity vs random routing over adapters x Zipf x rate, fleets by --find-replicas."""
    from bench._util import emit
    from bench.simgrid_plot import plot

    grid = GridConfig(
        adapters=tuple(int(a) for a in _floats(adapters)),
        zipf=_floats(zipf),
        rates=_floats(rates),
        duration_s=duration,
        warmup_s=warmup,
        seed=seed,
        slo_p95_ttft_s=slo_p95_ttft,
        trace=str(trace or ""),
    )
    if trace is not None:
        try:
            traces.read(trace)  # a bad file is a usage error here, not a traceback in every cell
        except traces.TraceError as exc:
            raise typer.BadParameter(str(exc), param_hint="--trace") from None
    name = "simgrid-trace" if trace is not None else "simgrid"
    result = run_grid(grid, max(jobs, 1))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    plot(result, out_dir / f"{name}.png")
    html_report.write(
        out_dir / f"{name}.html",
        f"Simulator grid{f' on {trace.name}' if trace is not None else ''}: replicas and routing modes",
        json.loads(json.dumps(result)),  # as the JSON file holds it (tuples as lists)
        [f"{name}.png"],
    )
    emit({"summary": result["summary"], "wall_s": result["wall_s"], "out_dir": str(out_dir)})
