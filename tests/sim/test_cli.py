"""`lorafleet simulate` end to end on a small fleet: one run, the A/B, and a trace saved and replayed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from sim.cli import simulate_cmd

app = typer.Typer()
app.command("simulate")(simulate_cmd)
app.command("noop")(lambda: None)  # two commands, so typer keeps the command name as in `lorafleet simulate`

SMALL = [
    "simulate",
    "--replicas",
    "4",
    "--adapters",
    "100",
    "--rate",
    "5",
    "--duration",
    "60",
    "--warmup",
    "5",
]


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the default HTML report goes to .data/sim/ under the working directory


def test_simulate_writes_its_report_as_one_html_page_where_the_console_links_it(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, SMALL)
    assert result.exit_code == 0, result.output
    page = (tmp_path / ".data" / "sim" / "report.html").read_text()
    assert page.startswith("<!doctype html>") and "100 adapters, 5 req/s" in page and "gpu_hit_rate" in page


def test_simulate_prints_the_report_as_json() -> None:
    result = CliRunner().invoke(app, [*SMALL, "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["config"]["replicas"] == 4
    assert 0 <= report["gpu_hit_rate"] <= 1 and report["ttft"]["p95_s"] > 0


def test_ab_replays_one_saved_trace_under_both_routings(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    first = CliRunner().invoke(app, [*SMALL, "--ab", "--trace-out", str(trace), "--json"])
    assert first.exit_code == 0, first.output
    # the saved trace keeps its own clock: no --rate (which would rescale it) and no --duration
    replay = ["simulate", "--replicas", "4", "--adapters", "100", "--warmup", "5", "--trace-in", str(trace)]
    again = CliRunner().invoke(app, [*replay, "--ab", "--json"])
    a, b = json.loads(first.output), json.loads(again.output)
    assert set(a["comparison"]) == {"cost", "table", "affinity", "random"}
    assert a["comparison"] == b["comparison"]
    assert a["runs"]["affinity"]["requests"] == len(trace.read_text().splitlines())
