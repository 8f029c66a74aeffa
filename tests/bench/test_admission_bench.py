"""bench admission: prompts of the asked length, one request's stages from two scrapes, and a quick run."""

from __future__ import annotations

import json

import pytest
from prometheus_client import generate_latest
from typer.testing import CliRunner

from bench.admission import one_request, prompt_for, stage_sums
from bench.cli import app
from replica.engine.trace import STAGES, AdmissionTrace
from replica.metrics import ReplicaMetrics


def test_prompt_for_reaches_the_asked_token_count() -> None:
    text, n = prompt_for(20, lambda t: 10 + len(t.split()))
    assert n == 20 and len(text.split()) == 10


def test_stages_of_the_one_request_between_two_scrapes() -> None:
    metrics = ReplicaMetrics("m")
    metrics.admitted(AdmissionTrace(*[i * 0.001 for i in range(10)]))
    before = stage_sums(generate_latest(metrics.registry).decode())
    metrics.admitted(AdmissionTrace(*[i * 0.002 for i in range(10)]))
    after = stage_sums(generate_latest(metrics.registry).decode())
    got = one_request(before, after)
    assert got is not None and list(got) == list(STAGES)
    assert all(v == pytest.approx(0.002) for v in got.values())
    metrics.admitted(AdmissionTrace(0.0))
    metrics.admitted(AdmissionTrace(0.0))
    assert one_request(after, stage_sums(generate_latest(metrics.registry).decode())) is None


@pytest.mark.slow
def test_quick_run_reports_each_stage_idle_and_under_load() -> None:
    result = CliRunner().invoke(app, ["admission", "--quick"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout[result.stdout.index("{") :])
    idle, loaded = out["idle"][0], out["under_load"]["results"][0]
    assert idle["prompt_tokens"] == 31 and idle["samples"] >= 1 and loaded["samples"] >= 1
    assert set(idle["stages_ms"]) == set(STAGES) and idle["stages_ms"]["prefill"] > 0
    assert idle["bare_forward_ms"] > 0 and idle["engine_step_in_process_ms"] > 0
    assert out["under_load"]["decode_step_ms"] > 0
    assert out["environment"]["load_average_1m_before"] >= 0
