"""step-overhead's child times this tree's decode step with and without adapters, eager and compiled."""

from __future__ import annotations

from bench.engine_ab import REPO
from bench.step_overhead import run_side


def test_a_side_reports_a_median_step_with_and_without_adapters_eager_and_compiled() -> None:
    result = run_side(REPO, batch=4, iters=5)
    steps = {"0", "4", "0:compiled", "4:compiled"}
    assert set(result) == steps | {f"operators:{d}" for d in steps} | {"failures:compiled"}
    assert all(0 < result[d] < 5 for d in steps)
    assert 100 < result["operators:0"] < result["operators:4"]  # adapters add operators to a step
    assert result["failures:compiled"] == 0  # the compiled step never fell back to eager
    assert result["operators:4:compiled"] < result["operators:4"] / 4  # compiled: a few fused calls a step
