"""AdmissionTrace turns one request's marks into stage times that add up to arrival -> first token."""

from __future__ import annotations

import pytest

from replica.engine.trace import STAGES, AdmissionTrace


def test_stages_follow_the_marks_in_order_and_add_up() -> None:
    marks = [0.0, 0.001, 0.0012, 0.0015, 0.002, 0.05, 0.0501, 0.0502, 0.15, 0.151]
    trace = AdmissionTrace(*marks)
    stages = trace.stages()
    assert list(stages) == list(STAGES)
    assert stages["http"] == pytest.approx(0.001) and stages["step_wait"] == pytest.approx(0.048)
    assert stages["prefill"] == pytest.approx(0.0998)
    assert sum(stages.values()) == pytest.approx(trace.delivered - trace.arrived)


def test_a_mark_before_its_predecessor_counts_as_zero() -> None:
    trace = AdmissionTrace(1.0, parsed=0.5)
    assert trace.stages()["http"] == 0.0
