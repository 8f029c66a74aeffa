"""The simulator on the fleet run's own trace, sizes, routing and timing, beside the run's numbers: GPU hit
rate within 2 points and p95 TTFT within 20% is agreement (issue: the simulator validated against real
processes).

Everything is put in the stand-ins' model seconds. The run replays arrivals on the wall clock while the
stand-ins' clock runs `slow` times slower, so the simulator sees the arrivals `slow` times closer together;
the control plane's periods (replica states, the stats windows that feed placement, the demand's time to
live) are wall periods, so in model seconds they are `slow` times shorter.

Both sides' GPU hit rate is also given over slices of the replay, which shows where a join, a kill or a
stall moved the run away from the simulator (it models none of them).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from bench.fleet_stack import FleetConfig
from sim import report
from sim.replica import CacheSizes
from sim.simulator import SimConfig, simulate
from sim.timing import load_timing
from sim.workload import Request

HIT_POINTS = 2.0
P95_REL = 0.20
DEMAND_TTL_S = 300.0  # the placement worker's default LORAFLEET_PLACEMENT_DEMAND_TTL_S


SLICES = 8


def hit_slices(found: list[tuple[float, str]], start_s: float, end_s: float, n: int = SLICES) -> list[dict]:
    """The GPU hit rate over n equal slices of [start_s, end_s] by arrival: (arrival, tier) pairs in, those
    with no tier (never answered) left out."""
    width = max(end_s - start_s, 1e-9) / n
    counts = [[0, 0] for _ in range(n)]
    for arrival, tier in found:
        if start_s <= arrival <= end_s and tier:
            row = counts[min(int((arrival - start_s) / width), n - 1)]
            row[0] += 1
            row[1] += tier == "gpu"
    return [
        {
            "from_s": round(start_s + i * width, 1),
            "requests": total,
            "gpu_hit_rate": round(hits / total, 4) if total else None,
        }
        for i, (total, hits) in enumerate(counts)
    ]


def simulate_run(
    cfg: FleetConfig,
    trace: list[Request],
    window_s: float,
    start: list[tuple[str, dict[str, list[str]]]],
    warmup_s: float = 0.0,
) -> dict[str, Any]:
    """The simulator's report for the run's configuration, in model seconds, from the fleet as it stood when
    the replay began: start holds each stand-in's id and its GPU slots (least recently used first) and RAM.
    The same ids give every adapter the same owners; the same contents, the same first loads. Requests of the
    first warmup_s (wall seconds) are left out, as in the run."""
    model_trace = [replace(r, arrival_s=r.arrival_s / cfg.slow) for r in trace]
    sim_cfg = SimConfig(
        replicas=cfg.replicas,
        replica_ids=tuple(rid for rid, _ in start),
        initial=tuple((tuple(c["gpu"]), tuple(c["ram"])) for _, c in start),
        routing=cfg.routing,
        report_interval_s=cfg.state_interval_s / cfg.slow,
        sizes=CacheSizes(gpu_slots=cfg.gpu_slots),
        warmup_s=warmup_s / cfg.slow,
        replan_s=window_s / cfg.slow,
        demand_ttl_s=DEMAND_TTL_S / cfg.slow,
    )
    result = simulate(sim_cfg, load_timing(list(cfg.calibration)), model_trace)
    span = max((r.arrival_s for r in trace), default=0.0)
    # by slices of the run's own (wall) arrival times
    found = [(sr.req.arrival_s * cfg.slow, sr.found_in) for sr in result.requests]
    return report.build(result) | {"gpu_hit_over_time": hit_slices(found, warmup_s, span)}


def agreement(
    run: dict[str, Any], simulated: dict[str, Any], standin_p95_s: float | None = None
) -> dict[str, Any]:
    """Both sides' GPU hit rate and p95 TTFT, their differences and whether each is within bounds. The run's
    p95 is the client's (ttft_p95_s: the way through the gateways included, which the simulator does not
    model) and, where given, the stand-ins' own (ttft_p95_s_at_replicas: arrival to first token on the
    model's schedule, what the simulator times)."""
    hit_run, hit_sim = run.get("gpu_hit_rate"), simulated.get("gpu_hit_rate")
    p95_sim = simulated["ttft"].get("p95_s")
    out: dict[str, Any] = {
        "gpu_hit_rate": {"run": hit_run, "simulator": hit_sim},
        "ttft_p95_s": _relative(run["ttft"].get("p95_s"), p95_sim),
        "bounds": {"hit_points": HIT_POINTS, "p95_relative": P95_REL},
    }
    if standin_p95_s is not None:
        out["ttft_p95_s_at_replicas"] = _relative(standin_p95_s, p95_sim)
    if hit_run is not None and hit_sim is not None:
        points = round(100 * (hit_sim - hit_run), 2)
        out["gpu_hit_rate"] |= {"points_apart": points, "agrees": abs(points) <= HIT_POINTS}
    return out


def _relative(run: float | None, simulator: float | None) -> dict[str, Any]:
    out: dict[str, Any] = {"run": run, "simulator": simulator}
    if run and simulator is not None:
        rel = round((simulator - run) / run, 3)
        out |= {"relative": rel, "agrees": abs(rel) <= P95_REL}
    return out
