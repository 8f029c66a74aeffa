"""`lorafleet bench simgrid` end to end on a two-cell grid: sized fleets, every routing mode, JSON and PNG."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from bench.simgrid import MODES, simgrid, slot_bound
from sim.cli import find_replicas
from sim.simulator import SimConfig
from sim.timing import TimingModel
from sim.workload import WorkloadConfig, generate

app = typer.Typer()
app.command("simgrid")(simgrid)
app.command("noop")(lambda: None)  # two commands, so typer keeps the command name


def test_a_two_cell_grid_sizes_each_fleet_and_runs_every_mode(tmp_path: Path) -> None:
    args = ["simgrid", "--adapters", "200", "--zipf", "1.0", "--rates", "2,4", "--duration", "90"]
    result = CliRunner().invoke(app, [*args, "--warmup", "15", "--jobs", "2", "--out-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    grid = json.loads((tmp_path / "simgrid.json").read_text())
    assert (tmp_path / "simgrid.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (tmp_path / "simgrid.html").read_text()
    assert page.startswith("<!doctype html>") and 'src="simgrid.png"' in page
    assert [(c["adapters"], c["zipf"], c["rate"]) for c in grid["cells"]] == [
        (200, 1.0, 2.0),
        (200, 1.0, 4.0),
    ]
    for cell in grid["cells"]:
        assert set(cell["modes"]) == set(MODES) and cell["sized_by"] == "cost"  # the gateway's default
        sizing = {int(n): t for n, t in cell["sizing"].items()}
        n = cell["replicas"]
        assert (
            sizing[n]["p95_ttft_s"] <= 1.0
            and cell["modes"][cell["sized_by"]]["p95_ttft_s"] == sizing[n]["p95_ttft_s"]
        )
        assert n - 1 not in sizing or sizing[n - 1]["p95_ttft_s"] > 1.0
        for mode in MODES:
            rep = cell["modes"][mode]
            assert 0 <= rep["gpu_hit_rate"] <= 1 and rep["p95_ttft_s"] > 0
            assert rep["goal_met"] == (rep["gpu_hit_rate"] >= 0.95 and rep["p95_ttft_s"] < 1.0)
    assert grid["summary"]["cells"] == 2
    assert grid["cells"][1]["replicas"] >= grid["cells"][0]["replicas"]


def test_slot_bound_is_the_share_of_the_most_popular_adapters() -> None:
    assert slot_bound(100, 1.0, 100) == pytest.approx(1.0)
    assert slot_bound(100, 0.0, 25) == pytest.approx(0.25)
    assert slot_bound(1000, 1.2, 100) > slot_bound(1000, 0.8, 100)


def test_find_replicas_from_a_lower_bound_finds_what_the_full_search_finds() -> None:
    trace = generate(WorkloadConfig(adapters=100, rate=6.0, duration_s=90.0, seed=3))
    cfg = SimConfig(replicas=8, warmup_s=15.0)
    full = find_replicas(cfg, TimingModel(), trace, 1.0, 0.0)
    assert (
        find_replicas(cfg, TimingModel(), trace, 1.0, 0.0, lo=full["replicas"] - 1)["replicas"]
        == full["replicas"]
    )
    # a lower bound that holds after all: the search goes on below it
    assert (
        find_replicas(cfg, TimingModel(), trace, 1.0, 0.0, lo=full["replicas"] + 1)["replicas"]
        == full["replicas"]
    )


def test_a_trace_grid_replays_the_file_at_each_cells_rate(tmp_path: Path) -> None:
    # two bursts of 40 arrivals, 60 s apart, with the file's own lengths
    rows = [f"{t:.3f},{300 + 7 * i},{40 + i % 5}" for i, t in enumerate([*range(40), *range(60, 100)])]
    trace = tmp_path / "burst.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    args = [
        "simgrid",
        "--adapters",
        "50",
        "--zipf",
        "0.9",
        "--rates",
        "2,4",
        "--duration",
        "0",
        "--warmup",
        "0",
    ]
    result = CliRunner().invoke(
        app, [*args, "--trace", str(trace), "--jobs", "1", "--out-dir", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    grid = json.loads((tmp_path / "simgrid-trace.json").read_text())
    assert grid["config"]["trace"] == str(trace) and (tmp_path / "simgrid-trace.html").is_file()
    slow, fast = grid["cells"]
    assert slow["requests"] == fast["requests"] == 80  # every row, whatever the rate
    assert slow["span_s"] == pytest.approx(2 * fast["span_s"], rel=0.01)  # the clock rescaled to each rate


def test_a_trace_grid_refuses_a_bad_file_before_any_cell_runs(tmp_path: Path) -> None:
    trace = tmp_path / "bad.csv"
    trace.write_text("TIMESTAMP,ContextTokens\n1,2\n")
    result = CliRunner().invoke(app, ["simgrid", "--trace", str(trace), "--out-dir", str(tmp_path)])
    assert result.exit_code == 2 and "GeneratedTokens" in result.output
    assert not (tmp_path / "simgrid-trace.json").exists()
