"""`lorafleet bench edge` in a short version: the real gateway with the stand-in, a quiet tenant served in
both phases, the slow connections cut at the header deadline and the noisy tenant refused past its limit.
No ratio is asserted: the machine's load decides it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bench.cli import app
from tests.integration.services import ServiceAddresses

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_a_short_edge_bench_cuts_the_slow_clients_refuses_the_flood_and_serves_the_quiet_tenant(
    service_env: ServiceAddresses,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)  # its logs go under .data/ here
    out = tmp_path / "edge.json"
    args = ["edge", "--repeats", "1", "--duration-s", "4", "--slowloris", "10", "--header-timeout-s", "1"]
    result = CliRunner().invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    ((pair),) = report["phases"]
    quiet, attacked = pair["quiet"], pair["attacked"]
    for phase in (quiet, attacked):
        assert phase["errors"] == {} and phase["ok"] == 40 and phase["ttft_p95_ms"] > 0, phase
    assert attacked["slowloris_cut"] >= 10, attacked  # each slow connection cut at least once
    assert attacked["noisy_answers"].get("429", 0) > attacked["noisy_answers"].get("404", 0), attacked
    assert report["ttft_p95_ratio_median"] > 0 and report["goal_ratio_at_most"] == 1.2
