"""Simulator against a real load test on one trace: the realized trace, both sides' numbers, the verdict.

The tolerance is fixed before either side runs: TTFT p50 and p95 agree when the difference is within
ttft_rel of the real value or within ttft_abs_s (whichever is looser: a relative bound alone is too tight
for a few tens of milliseconds, an absolute one too loose for seconds); GPU hit rates agree within
hit_points. Only requests that arrived after the warm-up count, on both sides.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from typing import Any

from sim.replica import SimRequest
from sim.report import TIERS, percentile
from sim.workload import Request


@dataclass(frozen=True)
class Tolerance:
    ttft_rel: float = 0.25
    ttft_abs_s: float = 0.25
    hit_points: float = 0.10


def realized(trace: list[Request], records: Iterable[dict[str, Any]]) -> list[Request]:
    """The trace with the token counts the server reported: the prompt as templated and tokenized, and
    the output the model actually produced (it may stop at its end token before max_tokens)."""
    seen = {r["request_id"]: r for r in records}
    out = []
    for req in trace:
        rec = seen.get(req.request_id)
        if rec is None or rec.get("usage_completion_tokens", -1) < 1:
            out.append(req)
            continue
        out.append(
            replace(
                req,
                prompt_tokens=max(1, rec["usage_prompt_tokens"]),
                output_tokens=rec["usage_completion_tokens"],
            )
        )
    return out


def _side(
    ttfts: list[float], tiers: list[str], by_tier: dict[str, list[float]], failed: int
) -> dict[str, Any]:
    values = sorted(ttfts)
    found = Counter(tiers)
    n = max(len(tiers), 1)
    misses = len(tiers) - found["gpu"]

    def pct(vals: list[float], q: float) -> float | None:
        v = percentile(sorted(vals), q)
        return None if v is None else round(v, 4)

    return {
        "requests": len(values),
        "failed": failed,
        "ttft_p50_s": pct(values, 50),
        "ttft_p95_s": pct(values, 95),
        "gpu_hit_rate": round(found["gpu"] / n, 4) if tiers else None,
        "ram_hit_rate": round(found["ram"] / misses, 4) if misses else None,
        "tier_share": {t: round(found[t] / n, 4) for t in TIERS},
        "ttft_p50_by_tier_s": {t: pct(v, 50) for t, v in by_tier.items() if v},
    }


def real_side(records: list[dict[str, Any]], warmup_s: float) -> dict[str, Any]:
    measured = [r for r in records if r["arrival_s"] >= warmup_s]
    ok = [r for r in measured if r["status"] == 200 and r["ttft_s"] >= 0]
    by_tier = {t: [r["ttft_s"] for r in ok if r["tier"] == t] for t in TIERS}
    return _side([r["ttft_s"] for r in ok], [r["tier"] for r in ok], by_tier, len(measured) - len(ok))


def sim_side(requests: list[SimRequest], warmup_s: float) -> dict[str, Any]:
    measured = [r for r in requests if r.req.arrival_s >= warmup_s]
    ttft = {id(r): r.first_token_s - r.req.arrival_s for r in measured}
    by_tier = {t: [ttft[id(r)] for r in measured if r.found_in == t] for t in TIERS}
    return _side(list(ttft.values()), [r.found_in for r in measured], by_tier, 0)


def verdict(real: dict[str, Any], sim: dict[str, Any], tol: Tolerance) -> dict[str, Any]:
    """Each compared metric with its limit and whether it holds; `agrees` when all hold."""
    checks: dict[str, dict[str, Any]] = {}
    for key in ("ttft_p50_s", "ttft_p95_s"):
        r, s = real[key], sim[key]
        limit = max(tol.ttft_rel * (r or 0.0), tol.ttft_abs_s)
        ok = r is not None and s is not None and abs(s - r) <= limit
        diff = None if r is None or s is None else round(s - r, 4)
        checks[key] = {"real": r, "sim": s, "sim_minus_real": diff, "limit": round(limit, 4), "ok": ok}
    r, s = real["gpu_hit_rate"], sim["gpu_hit_rate"]
    ok = r is not None and s is not None and abs(s - r) <= tol.hit_points
    diff = None if r is None or s is None else round(s - r, 4)
    checks["gpu_hit_rate"] = {"real": r, "sim": s, "sim_minus_real": diff, "limit": tol.hit_points, "ok": ok}
    return {"tolerance": asdict(tol), "checks": checks, "agrees": all(c["ok"] for c in checks.values())}
