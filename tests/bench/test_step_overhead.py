"""step-overhead's child times this tree's decode step with and without adapters."""

from __future__ import annotations

from bench.engine_ab import REPO
from bench.step_overhead import run_side


def test_a_side_reports_a_median_step_with_and_without_adapters() -> None:
    result = run_side(REPO, batch=4, iters=5)
    assert set(result) == {"0", "4", "operators:0", "operators:4"}
    assert 0 < result["0"] < 5 and 0 < result["4"] < 5
    assert 100 < result["operators:0"] < result["operators:4"]  # adapters add operators to a step
