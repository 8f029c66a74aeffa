"""The load test's PNG plots, drawn from summary.json alone: TTFT p50/p95 against rate by tier, TPOT, hit
rates, loads and evictions per minute per replica, and the distinct-adapter burst throughput.

series() takes the numbers out of a summary (pure); figures() draws them with matplotlib's object API on
the Agg canvas (no pyplot state, no display); write() saves one PNG per figure and plots.json, the exact
numbers each figure shows.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

TIERS = ("gpu", "ram", "disk", "remote")
CACHE_COUNTERS = ("gpu_loads", "gpu_evictions", "ram_evictions")
Series = dict[str, Any]


def series(summary: dict[str, Any]) -> dict[str, Series]:
    """figure name -> {"x": [...], "lines": {label: [y or None per x]}} (plus axis labels)."""
    rows = summary.get("rates", [])
    rates = [s["rate"] for s in rows]
    ttft: dict[str, list[float | None]] = {
        "all p50": [s["ttft"]["p50_s"] for s in rows],
        "all p95": [s["ttft"]["p95_s"] for s in rows],
    }
    for tier in TIERS:
        if any(tier in s["ttft_by_tier"] for s in rows):
            for q in ("p50", "p95"):
                ttft[f"{tier} {q}"] = [s["ttft_by_tier"].get(tier, {}).get(f"{q}_s") for s in rows]
    cache: dict[str, list[float | None]] = {}
    replicas = sorted({name for s in rows for name in s.get("replica_cache_per_min", {})})
    for name in replicas:
        for counter in CACHE_COUNTERS:
            cache[f"{name} {counter}"] = [
                s.get("replica_cache_per_min", {}).get(name, {}).get(counter, 0.0) for s in rows
            ]
    out: dict[str, Series] = {
        "ttft": {
            "title": "time to first token by tier (p50 solid, p95 dashed)",
            "x": rates,
            "xlabel": "request rate (req/s)",
            "ylabel": "TTFT (s)",
            "lines": ttft,
        },
        "tpot": {
            "title": "time per output token",
            "x": rates,
            "xlabel": "request rate (req/s)",
            "ylabel": "time per output token (s)",
            "lines": {"p50": [s["tpot"]["p50_s"] for s in rows], "p95": [s["tpot"]["p95_s"] for s in rows]},
        },
        "hit_rates": {
            "title": "cache hit rates",
            "x": rates,
            "xlabel": "request rate (req/s)",
            "ylabel": "hit rate",
            "lines": {
                "GPU": [s["gpu_hit_rate"] for s in rows],
                "RAM (of GPU misses)": [s["ram_hit_rate"] for s in rows],
            },
        },
        "cache_per_min": {
            "title": "adapter loads and evictions per minute, per replica",
            "x": rates,
            "xlabel": "request rate (req/s)",
            "ylabel": "per minute",
            "lines": cache,
        },
    }
    burst = summary.get("burst")
    if burst and burst.get("tokens_per_s"):
        counts = sorted(burst["tokens_per_s"], key=int)
        out["burst"] = {
            "title": "throughput by distinct adapters in a burst",
            "x": [int(d) for d in counts],
            "xlabel": f"distinct adapters in a burst of {burst['size']}",
            "ylabel": "output tokens/s",
            "lines": {"tokens/s (median)": [burst["tokens_per_s"][d] for d in counts]},
        }
    return out


def figures(data: dict[str, Series]) -> dict[str, Figure]:
    """One figure per series; a line per label, missing points (None) left out of that line."""
    out = {}
    for name, s in data.items():
        fig = Figure(figsize=(6.4, 4.0), dpi=100)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        for label, ys in s["lines"].items():
            points = [(x, y) for x, y in zip(s["x"], ys, strict=True) if y is not None]
            style = "--" if label.endswith("p95") else "-"
            ax.plot([p[0] for p in points], [p[1] for p in points], style, marker="o", label=label)
        ax.set_xlabel(s["xlabel"])
        ax.set_ylabel(s["ylabel"])
        ax.set_title(s.get("title", name.replace("_", " ")))
        ax.grid(True, alpha=0.3)
        if s["lines"]:
            ax.legend(fontsize="small")
        fig.tight_layout()
        out[name] = fig
    return out


def write(summary: dict[str, Any], report: Path) -> list[str]:
    """<name>.png per figure and plots.json under report; returns the PNG file names."""
    data = series(summary)
    names = []
    for name, fig in figures(data).items():
        fig.savefig(report / f"{name}.png")
        names.append(f"{name}.png")
    (report / "plots.json").write_text(json.dumps(data, indent=2) + "\n")
    return names
