"""`lorafleet bench gateway --quick` end to end: the stand-in replica and the real gateway as processes,
PostgreSQL for the key and alias, Kafka for replica.state; every request served on both paths, and a JSON
report that says what it measured (no figure is asserted: the machine's load decides those)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from matplotlib.image import imread
from typer.testing import CliRunner

from bench.cli import app
from tests.integration.services import ServiceAddresses

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_quick_gateway_bench_serves_every_request_on_both_paths(
    service_env: ServiceAddresses,
    tmp_path: Path,
) -> None:
    result = CliRunner().invoke(app, ["gateway", "--quick", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "gateway.json").read_text())

    assert report["benchmark"] == "gateway_overhead" and report["config"]["quick"] is True
    assert [row["rate_per_s"] for row in report["summary"]] == [10.0, 40.0]
    phases = report["phases"]
    assert {(p["path"], p["rate_per_s"]) for p in phases} == {
        (path, rate) for path in ("direct", "gateway") for rate in (10.0, 40.0)
    }
    for p in phases:
        assert p["errors"] == {} and p["ok"] == p["requests"] == round(p["rate_per_s"] * 1.5), p
        assert p["tokens"] == p["ok"] * report["config"]["max_tokens"]
        assert p["ttft_p50_ms"] > 0 and p["itl_p99_ms"] >= p["itl_p50_ms"] >= 0
    gateway_phases = [p for p in phases if p["path"] == "gateway"]
    assert all(p["cpu_s"]["gateway"] > 0 and p["gateway_cpu_s_per_1k_tokens"] > 0 for p in gateway_phases)
    for row in report["summary"]:
        assert set(row) >= {"added_ttft_p50_ms", "added_ttft_p99_ms", "added_itl_p99_ms", "gateway_cores"}
    layout = report["environment"]["cpu_layout"]
    assert set(layout["cpus"]) == {"gateway", "standin", "load_generator"}
    assert "highest_rate_p99_added_ttft_within_10ms" in report
    assert imread(tmp_path / "gateway.png").shape[0] > 100
