"""The fleet benchmark's plots and HTML report, drawn from its JSON alone: consumer lag per group over time,
TTFT p50/p95 by tier, the GPU hit rate over the replay (run and simulator), and CPU cores per process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ops import html_report


def _lag(result: dict[str, Any]) -> Figure:
    fig = Figure(figsize=(8, 4), dpi=100)
    ax = fig.add_subplot()
    samples = result["series"]["lag"]
    names = sorted({g for _, s in samples for g in s})
    replica_groups = [g for g in names if g.startswith("replica-")]
    ts = [t for t, _ in samples]
    for g in [g for g in names if not g.startswith("replica-")]:
        ax.plot(ts, [s.get(g, 0) for _, s in samples], label=g)
    if replica_groups:
        ax.plot(ts, [max(s.get(g, 0) for g in replica_groups) for _, s in samples], label="replica-* (max)")
    ax.set_xlabel("seconds from the start of the replay")
    ax.set_ylabel("records behind the end")
    ax.set_title("consumer lag per group")
    ax.legend(fontsize=8)
    return fig


def _ttft(result: dict[str, Any]) -> Figure:
    fig = Figure(figsize=(8, 4), dpi=100)
    ax = fig.add_subplot()
    by_tier = result["summary"]["ttft_by_tier"]
    tiers = list(by_tier)
    x = range(len(tiers))
    ax.bar([i - 0.2 for i in x], [by_tier[t]["p50_s"] or 0 for t in tiers], 0.4, label="p50")
    ax.bar([i + 0.2 for i in x], [by_tier[t]["p95_s"] or 0 for t in tiers], 0.4, label="p95")
    ax.set_xticks(list(x), tiers)
    ax.set_ylabel("time to first token, model seconds")
    ax.set_title(f"TTFT by tier (GPU hit rate {result['summary']['gpu_hit_rate']})")
    ax.legend()
    return fig


def _hits(result: dict[str, Any]) -> Figure:
    fig = Figure(figsize=(8, 4), dpi=100)
    ax = fig.add_subplot()
    for label, rows in (
        ("run", result.get("gpu_hit_over_time", [])),
        ("simulator", result.get("simulator", {}).get("gpu_hit_over_time", [])),
    ):
        shown = [r for r in rows if r["gpu_hit_rate"] is not None]
        ax.plot([r["from_s"] for r in shown], [r["gpu_hit_rate"] for r in shown], marker="o", label=label)
    ax.set_xlabel("seconds from the start of the replay (slice start)")
    ax.set_ylabel("GPU hit rate")
    ax.set_title("GPU hit rate over the replay")
    ax.legend()
    return fig


def _cpu(result: dict[str, Any]) -> Figure:
    fig = Figure(figsize=(8, 4), dpi=100)
    ax = fig.add_subplot()
    cores = result.get("cpu_cores_by_process", {})
    ax.barh(list(cores), list(cores.values()))
    ax.set_xlabel("CPU cores (mean over the replay)")
    ax.set_title("CPU per process")
    fig.tight_layout()
    return fig


FIGURES = {"fleet_lag.png": _lag, "fleet_ttft.png": _ttft, "fleet_hits.png": _hits, "fleet_cpu.png": _cpu}


def write_report(result: dict[str, Any], out: Path) -> list[str]:
    """One PNG per figure and fleet.html beside them; the PNG names."""
    names = []
    for name, draw in FIGURES.items():
        fig = draw(result)
        FigureCanvasAgg(fig)
        fig.savefig(out / name)
        names.append(name)
    shown = {k: v for k, v in result.items() if k != "series"}
    html_report.write(out / "fleet.html", "Fleet benchmark", shown, names, result.get("time_note", ""))
    return names
