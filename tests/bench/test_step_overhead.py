"""step-overhead's child times this tree's decode step with and without adapters."""

from __future__ import annotations

from bench.engine_ab import REPO
from bench.step_overhead import run_side


def test_a_side_reports_a_median_step_with_and_without_adapters() -> None:
    result = run_side(REPO, batch=4, iters=5)
    assert set(result) == {"0", "4"}
    assert all(0 < seconds < 5 for seconds in result.values())
