"""The validation's pieces: the realized trace, both sides' numbers after the warm-up, the verdict."""

from __future__ import annotations

import pytest

from sim.replica import SimRequest
from sim.validation import (
    INVALID,
    Tolerance,
    drift,
    pooled_contention,
    real_side,
    realized,
    sim_side,
    verdict,
)
from sim.workload import Request


def record(
    rid: int, arrival: float, ttft: float, tier: str, status: int = 200, prompt: int = 40, out: int = 9
):
    return {
        "request_id": rid,
        "arrival_s": arrival,
        "status": status,
        "ttft_s": ttft if status == 200 else -1.0,
        "tier": tier,
        "usage_prompt_tokens": prompt if status == 200 else -1,
        "usage_completion_tokens": out if status == 200 else -1,
    }


def test_realized_takes_the_servers_token_counts() -> None:
    trace = [Request(0, 0.0, "adapter-00000", 30, 16), Request(1, 1.0, "adapter-00001", 20, 16)]
    records = [record(0, 0.0, 0.5, "gpu", prompt=61, out=7), record(1, 1.0, 0.5, "", status=429)]
    served = realized(trace, records)
    assert served[0] == Request(0, 0.0, "adapter-00000", 61, 7)
    assert served[1] == trace[1]  # no usage: the trace's own counts


def test_both_sides_count_only_requests_after_the_warmup() -> None:
    records = [record(0, 1.0, 9.0, "remote")] + [record(i, 10.0 + i, 0.1 * i, "gpu") for i in range(1, 9)]
    records += [record(20, 30.0, 2.0, "ram"), record(21, 31.0, 0.0, "", status=503)]
    real = real_side(records, warmup_s=5.0)
    assert real["requests"] == 9 and real["failed"] == 1
    assert real["gpu_hit_rate"] == pytest.approx(8 / 9, abs=1e-4) and real["ram_hit_rate"] == 1.0
    assert real["ttft_p50_s"] == pytest.approx(0.5) and real["ttft_p95_s"] == 2.0
    sims = [
        SimRequest(Request(i, 10.0 + i, "a", 1, 1), found_in="gpu", first_token_s=10.2 + i) for i in range(4)
    ]
    sims.append(SimRequest(Request(9, 1.0, "a", 1, 1), found_in="ram", first_token_s=5.0))
    sim = sim_side(sims, warmup_s=5.0)
    assert sim["requests"] == 4 and sim["gpu_hit_rate"] == 1.0 and sim["ttft_p50_s"] == pytest.approx(0.2)


def test_verdict_applies_the_looser_of_the_relative_and_absolute_bounds() -> None:
    tol = Tolerance(ttft_rel=0.25, ttft_abs_s=0.25, hit_points=0.10)
    real = {"ttft_p50_s": 0.4, "ttft_p95_s": 4.0, "gpu_hit_rate": 0.80}
    ok = verdict(real, {"ttft_p50_s": 0.6, "ttft_p95_s": 4.9, "gpu_hit_rate": 0.89}, tol)
    assert (
        ok["agrees"]
        and ok["checks"]["ttft_p50_s"]["limit"] == 0.25
        and ok["checks"]["ttft_p95_s"]["limit"] == 1.0
    )
    bad = verdict(real, {"ttft_p50_s": 0.7, "ttft_p95_s": 5.1, "gpu_hit_rate": 0.69}, tol)
    assert not bad["agrees"]
    assert [k for k, c in bad["checks"].items() if not c["ok"]] == [
        "ttft_p50_s",
        "ttft_p95_s",
        "gpu_hit_rate",
    ]
    assert bad["checks"]["gpu_hit_rate"]["sim_minus_real"] == pytest.approx(-0.11)


def steps_file(step_b1: float, step_b8: float, ttfts: tuple[float, float], contention: float) -> dict:
    return {
        "runs": [
            {"batch": 1, "decode_step_s": {"1": {"median": step_b1}}},
            {"batch": 8, "decode_step_s": {"1": {"median": step_b8}, "8": {"median": 9.0}}},
        ],
        "prefill_by_length": [
            {"prompt_tokens": 40, "ttft_s": ttfts[0]},
            {"prompt_tokens": 300, "ttft_s": ttfts[1]},
        ],
        "host_contention": contention,
    }


def test_drift_is_the_geometric_mean_of_after_over_before_at_the_one_adapter_points() -> None:
    before = steps_file(0.2, 0.4, (0.5, 1.0), 0.3)
    after = steps_file(0.4, 0.8, (0.25, 1.0), 0.1)  # steps 2x slower, one ttft 2x faster, one the same
    d = drift(before, after)
    assert d["points"] == {"step_b1": 2.0, "step_b8": 2.0, "ttft_40_tokens": 0.5, "ttft_300_tokens": 1.0}
    assert d["after_over_before"] == pytest.approx(2 ** (1 / 4), abs=1e-4)
    assert d["host_contention"] == {"before": 0.3, "after": 0.1}
    assert drift(before, before)["after_over_before"] == 1.0


def test_a_run_whose_host_speed_changed_past_the_bound_is_invalid_whatever_its_checks() -> None:
    tol = Tolerance(max_drift=0.25)
    real = {"ttft_p50_s": 0.8, "ttft_p95_s": 1.6, "gpu_hit_rate": 0.9}
    near = {"ttft_p50_s": 0.85, "ttft_p95_s": 1.7, "gpu_hit_rate": 0.88}
    far = {"ttft_p50_s": 1.2, "ttft_p95_s": 1.7, "gpu_hit_rate": 0.88}
    assert verdict(real, near, tol)["outcome"] == "agrees"  # one calibration: no drift rule
    assert verdict(real, near, tol, 1.24)["outcome"] == "agrees"
    assert verdict(real, far, tol, 0.81)["outcome"] == "disagrees"
    for ratio in (1.26, 0.79):
        v = verdict(real, near, tol, ratio)
        assert v["outcome"] == INVALID and not v["valid"] and v["agrees"]  # the checks are still reported
    assert not verdict(real, far, tol, 1.3)["agrees"]


def test_pooled_contention_is_the_mean_of_the_calibrations_that_measured_it() -> None:
    assert pooled_contention([0.2, None, 0.4]) == pytest.approx(0.3)
    assert pooled_contention([None]) is None
