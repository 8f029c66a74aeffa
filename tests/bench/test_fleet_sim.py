"""The fleet run's comparison with the simulator: agreement within bounds on both p95s, the hit rate over
slices of the replay, and the stand-ins' times kept apart from the warm-up."""

from __future__ import annotations

from bench.fleet import _arrived_after
from bench.fleet_sim import agreement, hit_slices


def _side(hit: float, p95: float) -> dict:
    return {"gpu_hit_rate": hit, "ttft": {"p95_s": p95}}


def test_agreement_judges_the_hit_rate_in_points_and_each_p95_relative() -> None:
    out = agreement(_side(0.95, 1.20), _side(0.965, 0.90), standin_p95_s=0.80)
    assert out["gpu_hit_rate"]["points_apart"] == 1.5 and out["gpu_hit_rate"]["agrees"]
    assert out["ttft_p95_s"]["relative"] == -0.25 and not out["ttft_p95_s"]["agrees"]  # the client's
    assert out["ttft_p95_s_at_replicas"]["relative"] == 0.125 and out["ttft_p95_s_at_replicas"]["agrees"]
    far = agreement(_side(0.90, 1.0), _side(0.95, 1.0))
    assert far["gpu_hit_rate"]["points_apart"] == 5.0 and not far["gpu_hit_rate"]["agrees"]
    assert "ttft_p95_s_at_replicas" not in far


def test_agreement_leaves_out_what_one_side_lacks() -> None:
    out = agreement({"gpu_hit_rate": None, "ttft": {"p95_s": None}}, _side(0.9, 0.5), standin_p95_s=None)
    assert "agrees" not in out["gpu_hit_rate"] and "agrees" not in out["ttft_p95_s"]


def test_hit_slices_count_answered_requests_by_arrival() -> None:
    found = [
        (10.0, "gpu"),
        (20.0, "ram"),
        (55.0, "gpu"),
        (60.0, "gpu"),
        (30.0, ""),
        (5.0, "gpu"),
        (61.0, "ram"),
    ]
    slices = hit_slices(found, 10.0, 60.0, n=2)
    assert [s["from_s"] for s in slices] == [10.0, 35.0]
    # (10, gpu) (20, ram) in the first; (55, gpu) and (60, gpu), the end itself, in the last; the unanswered
    # one and those outside [10, 60] in none
    assert [(s["requests"], s["gpu_hit_rate"]) for s in slices] == [(2, 0.5), (2, 1.0)]
    assert hit_slices([], 0.0, 10.0, n=3)[0]["gpu_hit_rate"] is None


def test_a_standins_times_are_kept_from_the_end_of_the_warm_up() -> None:
    row = {"t0_unix": 1000.0, "slow": 5.0, "ttft_s": [[0.0, 0.1], [3.9, 0.2], [4.0, 0.3], [9.0, 0.4]]}
    # arrivals at 1000, 1019.5, 1020 and 1045 on the wall; the warm-up ends at 1020
    assert _arrived_after(row, "ttft_s", 1020.0) == [0.3, 0.4]
