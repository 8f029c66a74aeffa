"""Simulator against a real load test on one trace: the realized trace, both sides' numbers, the verdict.

The tolerance is fixed before either side runs: TTFT p50 and p95 agree when the difference is within
ttft_rel of the real value or within ttft_abs_s (whichever is looser: a relative bound alone is too tight
for a few tens of milliseconds, an absolute one too loose for seconds); GPU hit rates agree within
hit_points. Only requests that arrived after the warm-up count, on both sides.

The timing model is calibrated on the serving replicas right before and right after the real run, and the
simulator uses both measurements pooled. A shared host's speed drifts with its other users; when the two
calibrations differ by more than max_drift (the geometric mean, over the one-adapter step points and the
single-request times to first token, of after / before), the host alone moved TTFT by about as much as the
TTFT tolerance allows and no calibration stands for the whole run: the run is reported as invalid (and
counted), whatever its checks say.
"""

from __future__ import annotations

import math
import statistics
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
    # the most the host's speed may change between the calibrations before and after the run (as a ratio:
    # after / before within [1 / (1 + max_drift), 1 + max_drift]); set to ttft_rel, the TTFT tolerance
    max_drift: float = 0.25


INVALID = "invalid: the host's speed changed during the run"


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


def speed_points(steps: dict[str, Any]) -> dict[str, float]:
    """A bench/replica_steps.py file's host-speed measurements: the one-adapter decode step at each batch
    size and one request's time to first token at each prompt length, in seconds."""
    points = {
        f"step_b{run['batch']}": float(run["decode_step_s"]["1"]["median"])
        for run in steps.get("runs", [])
        if "1" in run.get("decode_step_s", {})
    }
    for p in steps.get("prefill_by_length", []):
        points[f"ttft_{int(p['prompt_tokens'])}_tokens"] = float(p["ttft_s"])
    return points


def drift(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """How the host's speed changed from one calibration to the other: after / before at every point both
    measured, and their geometric mean (above 1: the host got slower)."""
    b, a = speed_points(before), speed_points(after)
    ratios = {k: a[k] / b[k] for k in b if k in a and b[k] > 0 and a[k] > 0}
    index = math.exp(statistics.fmean(math.log(r) for r in ratios.values())) if ratios else None
    return {
        "after_over_before": None if index is None else round(index, 4),
        "points": {k: round(r, 4) for k, r in ratios.items()},
        "host_contention": {"before": before.get("host_contention"), "after": after.get("host_contention")},
    }


def pooled_contention(values: Iterable[float | None]) -> float | None:
    """The host contention the simulator uses from several calibrations: their mean (None if none has it)."""
    known = [float(v) for v in values if v is not None]
    return statistics.fmean(known) if known else None


def verdict(
    real: dict[str, Any], sim: dict[str, Any], tol: Tolerance, drift_ratio: float | None = None
) -> dict[str, Any]:
    """Each compared metric with its limit and whether it holds; `agrees` when all hold; `outcome` is
    "agrees", "disagrees" or, when the host's speed changed past tol.max_drift between the calibrations
    (drift_ratio: after / before; None: one calibration, no rule), INVALID."""
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
    agrees = all(c["ok"] for c in checks.values())
    valid = drift_ratio is None or 1.0 / (1.0 + tol.max_drift) <= drift_ratio <= 1.0 + tol.max_drift
    return {
        "tolerance": asdict(tol),
        "checks": checks,
        "agrees": agrees,
        "drift_after_over_before": drift_ratio,
        "valid": valid,
        "outcome": ("agrees" if agrees else "disagrees") if valid else INVALID,
    }
