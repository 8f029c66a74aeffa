"""Summaries of a load test: per rate, TTFT p50/p95 overall and by tier, TPOT, hit rates, statuses; and
the markdown report."""

from __future__ import annotations

from collections import Counter
from typing import Any

from loadtest.client import RequestRecord
from loadtest.runner import tenant_of
from sim.report import TIERS, percentile, tenant_p95


def pcts(values: list[float]) -> dict[str, float | None]:
    ordered = sorted(values)
    return {f"p{q}_s": (None if (v := percentile(ordered, q)) is None else round(v, 4)) for q in (50, 95)}


def summarise(records: list[RequestRecord], rate: float, duration_s: float) -> dict[str, Any]:
    ok = [r for r in records if r.status == 200 and r.ttft_s >= 0]
    tiers = Counter(r.tier for r in ok)
    n = max(len(ok), 1)
    misses = len(ok) - tiers["gpu"]
    return {
        "rate": rate,
        "requests": len(records),
        "ok": len(ok),
        "statuses": {str(k): v for k, v in sorted(Counter(r.status for r in records).items())},
        "errors": dict(Counter(r.error for r in records if r.error)),
        "ttft": pcts([r.ttft_s for r in ok]),
        "ttft_by_tier": {t: pcts([r.ttft_s for r in ok if r.tier == t]) for t in TIERS if tiers[t]},
        "tpot": pcts([r.tpot_s for r in ok if r.tpot_s >= 0]),
        "ttft_by_tenant": tenant_p95((tenant_of(r.model), r.ttft_s) for r in ok),
        "tier_share": {t: round(tiers[t] / n, 4) for t in TIERS},
        "gpu_hit_rate": round(tiers["gpu"] / n, 4) if ok else None,
        "ram_hit_rate": round(tiers["ram"] / misses, 4) if misses else None,
        "output_tokens_per_s": round(sum(r.chunks for r in ok) / duration_s, 2),
        "completion_tokens_mean": _mean(
            [r.usage_completion_tokens for r in ok if r.usage_completion_tokens >= 0]
        ),
        "prompt_tokens_mean": _mean([r.usage_prompt_tokens for r in ok if r.usage_prompt_tokens >= 0]),
    }


def _mean(values: list[int]) -> float | None:
    return round(sum(values) / len(values), 2) if values else None


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def markdown(summary: dict[str, Any]) -> str:
    """The human report: one row per rate, then TTFT by tier."""
    lines = [
        "# Load test",
        "",
        f"Gateway {summary['gateway']}, {_models(summary['models'])}, "
        f"{summary['duration_s']} s per rate, Zipf s={summary['zipf_s']}.",
        "",
        "| rate (req/s) | requests | ok | TTFT p50 | TTFT p95 | TPOT p50 | TPOT p95 "
        "| GPU hit | RAM hit | out tok/s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summary["rates"]:
        lines.append(
            f"| {s['rate']:g} | {s['requests']} | {s['ok']} | {_fmt(s['ttft']['p50_s'])} | "
            f"{_fmt(s['ttft']['p95_s'])} | {_fmt(s['tpot']['p50_s'])} | {_fmt(s['tpot']['p95_s'])} | "
            f"{_fmt(s['gpu_hit_rate'])} | {_fmt(s['ram_hit_rate'])} | {s['output_tokens_per_s']} |"
        )
    lines += ["", "## TTFT by tier (s)", "", "| rate | tier | p50 | p95 |", "|---|---|---|---|"]
    for s in summary["rates"]:
        for tier, p in s["ttft_by_tier"].items():
            lines.append(f"| {s['rate']:g} | {tier} | {_fmt(p['p50_s'])} | {_fmt(p['p95_s'])} |")
    tenants = [(s["rate"], s["ttft_by_tenant"]) for s in summary["rates"] if s.get("ttft_by_tenant")]
    if tenants:
        lines += [
            "",
            "## TTFT p95 by tenant (s)",
            "",
            "| rate | tenant | requests | p95 |",
            "|---|---|---|---|",
        ]
        for rate, t in tenants:
            rows = [*t["top"], {**t["worst"], "tenant": f"{t['worst']['tenant']} (worst)"}]
            lines += [
                f"| {rate:g} | {r['tenant']} | {r['requests']} | {_fmt(r['p95_ttft_s'])} |" for r in rows
            ]
    cache = [
        (s["rate"], url, c) for s in summary["rates"] for url, c in s.get("replica_cache_per_min", {}).items()
    ]
    if cache:
        lines += ["", "## Replica cache, per minute", "", "| rate | replica | counters |", "|---|---|---|"]
        lines += [f"| {r:g} | {url} | {', '.join(f'{k} {v}' for k, v in c.items())} |" for r, url, c in cache]
    lines += _burst(summary.get("burst"))
    if summary.get("plots"):
        lines += ["", "## Plots", ""] + [f"![{p[:-4]}]({p})" for p in summary["plots"]]
    return "\n".join(lines) + "\n"


def _models(models: list[str]) -> str:
    if len(models) <= 6:
        return f"models {', '.join(models)}"
    return f"{len(models)} models ({models[0]} ... {models[-1]})"


def _burst(burst: dict[str, Any] | None) -> list[str]:
    if not burst or not burst.get("tokens_per_s"):
        return []
    ratios = burst.get("ratio_to_1_adapter") or {}
    warm = "pre-warmed through the replicas" if burst["prewarmed"] else "warmed by an unmeasured burst"
    lines = [
        "",
        f"## Distinct adapters in a burst of {burst['size']} concurrent requests",
        "",
        f"Output tokens/s, median of {burst['repeats']} interleaved repeats, {burst['max_tokens']} tokens "
        f"each, temperature 0; {warm}.",
        "",
        "| distinct adapters | tokens/s | ratio to 1 adapter |",
        "|---|---|---|",
    ]
    for d, tps in burst["tokens_per_s"].items():
        ratio = ratios.get(d)
        lines.append(f"| {d} | {tps:.2f} | {'-' if ratio is None else f'{ratio:.3f}'} |")
    lines += ["", f"Ratio to base: {burst['base_note']}."]
    return lines
