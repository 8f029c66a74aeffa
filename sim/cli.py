"""`lorafleet simulate`: the fleet simulator from the command line (one run, a routing A/B, or a search for
the smallest fleet that holds a p95 TTFT target), on a generated workload or a replayed trace (sim.trace)."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer

from ops import html_report
from placement_worker.planner import Policy
from sim import report
from sim import trace as traces
from sim.replica import CacheSizes
from sim.simulator import SimConfig, simulate
from sim.timing import TimingModel, load_timing
from sim.workload import Request, WorkloadConfig, generate, save

log = logging.getLogger(__name__)

AB_MODES = ("cost", "table", "affinity", "random")  # the new router, a fixed table, today's, the baseline


def _run(cfg: SimConfig, timing: TimingModel, trace: list[Request], gpu_hour_usd: float) -> dict[str, Any]:
    start = time.perf_counter()
    result = report.build(simulate(cfg, timing, trace), gpu_hour_usd)
    result["wall_s"] = round(time.perf_counter() - start, 2)
    return result


def find_replicas(
    cfg: SimConfig,
    timing: TimingModel,
    trace: list[Request],
    slo_p95_s: float,
    gpu_hour_usd: float,
    lo: int = 0,
) -> dict[str, Any]:
    """Smallest fleet whose p95 TTFT is within slo_p95_s (binary search; doubles the top until it holds).

    lo: a fleet size expected to miss the target, where the search starts; if it holds after all, the
    search goes on below it from 0."""
    tried: dict[int, dict[str, Any]] = {}

    def ok(n: int) -> bool:
        if n not in tried:
            tried[n] = _run(replace(cfg, replicas=n), timing, trace, gpu_hour_usd)
            log.info("replicas=%d p95=%s", n, tried[n]["ttft"]["p95_s"])
        p95 = tried[n]["ttft"]["p95_s"]
        return p95 is not None and p95 <= slo_p95_s

    hi = max(cfg.replicas, 1)
    while not ok(hi):
        if hi >= 1024:
            raise typer.BadParameter(f"no fleet up to {hi} replicas holds p95 TTFT <= {slo_p95_s} s")
        hi *= 2
    if 0 < lo < hi and ok(lo):
        hi, lo = lo, 0
    lo = lo if lo < hi else 0  # 0 replicas never holds
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    chosen = tried[hi]
    return {
        "slo_p95_ttft_s": slo_p95_s,
        "replicas": hi,
        "ttft": chosen["ttft"],
        "gpu_hit_rate": chosen["gpu_hit_rate"],
        "gpus_needed": chosen["gpus_needed"],
        "cost": chosen["cost"],
        "tried": {
            n: {"p95_ttft_s": r["ttft"]["p95_s"], "gpu_hit_rate": r["gpu_hit_rate"]}
            for n, r in sorted(tried.items())
        },
        "report": chosen,
    }


def load_trace(path: Path, replay: traces.ReplayConfig) -> tuple[list[Request], dict[str, Any]]:
    """The replay of a trace file and what it took from it; a bad file is a usage error, not a traceback."""
    try:
        source = traces.read(path)
    except traces.TraceError as exc:
        raise typer.BadParameter(str(exc), param_hint="--trace") from None
    shaped = traces.shape(source, replay)
    if not shaped:
        raise typer.BadParameter(
            f"{path}: no request in the window "
            f"(offset {replay.offset_s:g} s, duration {replay.duration_s:g} s)",
            param_hint="--trace",
        )
    return shaped, traces.describe(source, shaped, replay)


def simulate_cmd(
    replicas: Annotated[int, typer.Option(help="Replicas (GPUs) in the fleet.")] = 26,
    adapters: Annotated[int, typer.Option(help="Adapters in the Zipf mix.")] = 5000,
    rate: Annotated[
        float | None,
        typer.Option(
            help="Requests per second: Poisson (default 40), or a --trace rescaled to this mean "
            "(default: the trace's own clock)."
        ),
    ] = None,
    zipf: Annotated[float, typer.Option(help="Zipf exponent s of adapter popularity.")] = 1.0,
    tenants: Annotated[
        int, typer.Option(help="Tenants owning the adapters (adapter rank r -> tenant r mod N); 0: one each.")
    ] = 0,
    routing: Annotated[str, typer.Option(help="cost | affinity | table | random")] = "cost",
    duration: Annotated[
        float | None,
        typer.Option(help="Simulated seconds of arrivals (default 3600; with --trace: the whole trace)."),
    ] = None,
    warmup: Annotated[float, typer.Option(help="Seconds of arrivals left out of the report.")] = 60.0,
    seed: Annotated[int, typer.Option()] = 0,
    gpu_slots: Annotated[int, typer.Option(help="GPU adapter slots per replica.")] = CacheSizes.gpu_slots,
    ram_gb: Annotated[float, typer.Option(help="Host RAM for adapters per replica, GB.")] = (
        CacheSizes.ram_bytes / 1e9
    ),
    disk_gb: Annotated[float, typer.Option(help="Local disk for adapters per replica, GB.")] = (
        CacheSizes.disk_bytes / 1e9
    ),
    adapter_mb: Annotated[float, typer.Option(help="Adapter size, MB.")] = CacheSizes.adapter_bytes / 1e6,
    owners: Annotated[int, typer.Option(help="Default owners per adapter.")] = 2,
    spill_wait: Annotated[
        float, typer.Option(help="Router: an owner is overloaded when a new request would wait longer, s.")
    ] = 1.0,
    replan_s: Annotated[
        float,
        typer.Option(
            help="Re-plan placement this often from observed traffic, starting as a just-registered fleet "
            "(each adapter in its home's GPU slot); 0: fixed from the whole trace's demand."
        ),
    ] = 0.0,
    gpu_tokens_per_s: Annotated[
        float, typer.Option(help="Placement asks adapters with this much traffic into GPU (tokens/s).")
    ] = Policy.gpu_tokens_per_s,
    gpu_slot_fraction: Annotated[
        float, typer.Option(help="Most of a replica's GPU slots placement asks for (hottest first).")
    ] = Policy.gpu_slot_fraction,
    gpu_hour_usd: Annotated[float, typer.Option(help="Price of one GPU-hour.")] = 2.5,
    calibration: Annotated[
        list[Path] | None, typer.Option(help="bench engine / bench load calibration JSON (repeatable).")
    ] = None,
    trace_in: Annotated[
        Path | None,
        typer.Option(
            "--trace",
            "--trace-in",
            help="Replay this trace instead of generating: a CSV with TIMESTAMP, ContextTokens and "
            "GeneratedTokens (adapters drawn from --adapters/--zipf/--tenants), or --trace-out's JSONL.",
        ),
    ] = None,
    trace_offset: Annotated[
        float, typer.Option(help="Skip this many seconds of the trace's own clock first.")
    ] = 0.0,
    trace_out: Annotated[Path | None, typer.Option(help="Save the trace as JSONL.")] = None,
    ab: Annotated[
        bool, typer.Option("--ab", help="Run cost, table, affinity and random routing on one trace.")
    ] = False,
    find: Annotated[bool, typer.Option("--find-replicas", help="Smallest fleet that holds the SLO.")] = False,
    slo_p95_ttft: Annotated[float, typer.Option(help="p95 TTFT target for --find-replicas, s.")] = 1.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the whole report as JSON.")] = False,
    out: Annotated[Path | None, typer.Option(help="Also write the JSON here.")] = None,
    html: Annotated[
        Path | None, typer.Option(help="Write the report as one HTML page here (the console links it).")
    ] = Path(".data/sim/report.html"),
) -> None:
    """Simulate the fleet at scale with the real router, placement and cache code."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    replayed: dict[str, Any] | None = None
    if trace_in is not None:
        replay = traces.ReplayConfig(
            rate or 0.0, duration or 0.0, trace_offset, adapters, zipf, tenants, seed
        )
        trace, replayed = load_trace(trace_in, replay)
    else:
        rate = 40.0 if rate is None else rate
        duration = 3600.0 if duration is None else duration
        workload = WorkloadConfig(
            adapters=adapters, rate=rate, zipf_s=zipf, duration_s=duration, seed=seed, tenants=tenants
        )
        trace = generate(workload)
    if trace_out is not None:
        save(trace, trace_out)
    timing = load_timing(calibration or [])
    sizes = CacheSizes(
        gpu_slots=gpu_slots,
        adapter_bytes=round(adapter_mb * 1e6),
        ram_bytes=round(ram_gb * 1e9),
        disk_bytes=round(disk_gb * 1e9),
    )
    cfg = SimConfig(
        replicas=replicas,
        routing=routing,
        owners_k=owners,
        spill_wait_s=spill_wait,
        sizes=sizes,
        warmup_s=warmup,
        seed=seed,
        replan_s=replan_s,
        gpu_tokens_per_s=gpu_tokens_per_s,
        gpu_slot_fraction=gpu_slot_fraction,
    )
    result: dict[str, Any]
    if find:
        result = find_replicas(cfg, timing, trace, slo_p95_ttft, gpu_hour_usd)
    elif ab:
        runs = {mode: _run(replace(cfg, routing=mode), timing, trace, gpu_hour_usd) for mode in AB_MODES}
        result = {"comparison": report.compare(runs), "runs": runs}
    else:
        result = _run(cfg, timing, trace, gpu_hour_usd)
    if replayed is not None:
        result = {"trace": {"file": str(trace_in), **replayed}, **result}
    text = json.dumps(result, indent=2)
    if out is not None:
        out.write_text(text + "\n")
    if html is not None:
        shown_rate = replayed["rate"] if replayed is not None else rate
        intro = f"{adapters} adapters, {shown_rate:g} req/s, Zipf {zipf:g}."
        if replayed is not None:
            intro = f"Trace {trace_in}: {intro}"
        html_report.write(html, "Simulator", result, intro=intro)
    if as_json:
        typer.echo(text)
    else:
        brief = result.get("comparison") or {
            k: result.get(k)
            for k in ("trace", "replicas", "ttft", "gpu_hit_rate", "ram_hit_rate", "gpus_needed", "cost")
        }
        typer.echo(json.dumps(brief, indent=2))
