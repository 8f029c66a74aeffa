"""bench/gpu_check.py runs with torch and triton alone, measures every section at smoke sizes on the CPU,
keeps what it measured when a section breaks, and writes a calibration file the simulator reads."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import torch
import typer
from typer.testing import CliRunner

from bench import gpu_check
from bench.gpu_sections import decode, model
from bench.gpu_sections.calibration import RAM_TIER, calibration
from bench.gpu_sections.common import Bench
from bench.gpu_sections.modes import MODES
from schemas.tiers import LOAD_S
from sim.cli import simulate_cmd
from sim.timing import TimingModel, fit_steps, load_timing

REPO = Path(__file__).resolve().parents[2]
SMOKE = MODES["cpu-smoke"]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def required_distributions(roots: list[str]) -> set[str]:
    """The roots and every distribution they require, transitively (extras left out)."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        dist = canonical(todo.pop())
        if dist in seen:
            continue
        try:
            requirements = metadata.requires(dist) or []
        except metadata.PackageNotFoundError:  # required on another platform only
            continue
        seen.add(dist)
        todo += [re.split(r"[\s;<>=!~\[(]", r, maxsplit=1)[0] for r in requirements if "extra ==" not in r]
    return seen


@pytest.fixture(scope="module")
def bare_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A site folder holding what `pip install torch triton` installs, and nothing else: links to those
    distributions' top-level files in this environment (numpy is not among them)."""
    site = tmp_path_factory.mktemp("bare_site")
    for name in sorted(required_distributions(["torch", "triton"])):
        dist = metadata.distribution(name)
        for top in {f.parts[0] for f in dist.files or [] if f.parts[0] not in ("..", "__pycache__")}:
            source = Path(str(dist.locate_file(top)))
            if source.exists() and not (site / top).exists():
                (site / top).symlink_to(source)
    return site


def run_bare(site: Path, code: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """code in a Python that sees the standard library, the bare site and this repository only (-S: no
    site-packages), as on the GPU machine."""
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run(
        [sys.executable, "-S", "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_the_script_imports_nothing_but_torch_triton_and_the_standard_library(bare_site: Path) -> None:
    result = run_bare(bare_site, "import bench.gpu_check, sys; assert 'numpy' not in sys.modules")
    assert result.returncode == 0, result.stderr[-3000:]


def test_the_bare_site_lacks_what_the_replica_service_needs(bare_site: Path) -> None:
    result = run_bare(bare_site, "import bench.gpu_check\nimport schemas.api\n")
    assert result.returncode != 0
    assert "No module named 'pydantic'" in result.stderr


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory, bare_site: Path) -> dict[str, Any]:
    """One --cpu-smoke run as a script on the bare site: its report, calibration file and wall time."""
    folder = tmp_path_factory.mktemp("smoke")
    out = folder / "report.json"
    argv = ["bench/gpu_check.py", "--cpu-smoke", "--out", str(out)]
    code = (
        f"import runpy, sys\nsys.argv = {argv!r}\nrunpy.run_path('bench/gpu_check.py', run_name='__main__')\n"
    )
    start = time.perf_counter()
    result = run_bare(bare_site, code, timeout=300)
    wall_s = time.perf_counter() - start
    assert result.returncode == 0, result.stderr[-3000:]
    return dict(
        report=json.loads(out.read_text()),
        calibration=folder / "report.calibration.json",
        folder=folder,
        stdout=result.stdout,
        wall_s=wall_s,
    )


def test_a_smoke_run_finishes_every_section(smoke: dict[str, Any]) -> None:
    sections = smoke["report"]["sections"]
    assert list(sections) == list(gpu_check.SECTIONS)
    sampling_there = (REPO / "bench" / "sampling.py").exists()
    for name, section in sections.items():
        want = "ok" if name != "sampling" or sampling_there else "skipped: bench/sampling.py is not there"
        assert section["status"] == want, (name, section["status"])
        assert section["wall_s"] >= 0
    assert sections["decode"]["captured"]["status"] == "skipped: no CUDA"
    assert smoke["wall_s"] < 120, "the smoke run is meant to take well under a minute"
    assert "decode eager" in smoke["stdout"]  # the printed table
    assert not list(smoke["folder"].glob(".*.tmp")), "an atomic write left its temporary file"


def test_the_smoke_run_checks_every_kernel_case_against_the_reference(smoke: dict[str, Any]) -> None:
    kernels = smoke["report"]["sections"]["kernels"]
    assert kernels["implementation"] == "torch"
    assert {row["launch"] for row in kernels["lora"]} == {"gathered", "segmented"}
    assert len(kernels["lora"]) == 3 * len(SMOKE.kernel_ranks) * 2  # module shapes x ranks x launches
    assert all(row["ok"] for row in kernels["lora"] + kernels["paged_decode"])
    assert {row["kv_heads"] for row in kernels["paged_decode"]} == {2, 1}  # the model's heads and grouped


def test_decode_measures_the_whole_grid_against_its_floor(smoke: dict[str, Any]) -> None:
    eager = smoke["report"]["sections"]["decode"]["eager"]
    grid = {(b, c, d) for b in SMOKE.batches for c in SMOKE.contexts for d in SMOKE.distinct if d <= b}
    assert {(p["batch"], p["context"], p["distinct"]) for p in eager["points"]} == grid
    for p in eager["points"]:
        assert p["status"] == "ok" and p["median_s"] > 0 and p["iters"] == SMOKE.iters
        assert p["over_floor"] == pytest.approx(p["median_s"] / p["floor_s"])
    floor = smoke["report"]["sections"]["decode"]["floor"]
    by_point = {(p["batch"], p["context"], p["distinct"]): p for p in eager["points"]}
    extra = by_point[(32, 64, 32)]["floor_s"] - by_point[(32, 64, 0)]["floor_s"]
    assert extra == pytest.approx(32 * floor["adapter_bytes"] / floor["hbm_bytes_per_s"])
    ratios = {(r["batch"], r["context"], r["distinct"]): r["ratio"] for r in eager["ratio_vs_0"]}
    assert set(ratios) == {point for point in grid if point[2] > 0}
    step = by_point[(32, 64, 0)]["median_s"] / by_point[(32, 64, 32)]["median_s"]
    assert ratios[(32, 64, 32)] == pytest.approx(step)


def test_the_other_sections_report_their_figures(smoke: dict[str, Any]) -> None:
    sections = smoke["report"]["sections"]
    kv = sections["kv_blocks"]
    assert (
        kv["budget_bytes"] == SMOKE.cpu_kv_bytes
        and kv["blocks"] == kv["budget_bytes"] // kv["block_bytes"] - 1  # one is the padding rows' sink
    )
    assert kv["tokens"] == kv["blocks"] * kv["block_size"]
    loads = sections["slot_load"]["by_rank"]
    assert {rank: r["bucket"] for rank, r in loads.items()} == {"8": 16, "16": 16, "64": 64}
    assert all(r["median_s"] > 0 and r["floor_s"] > 0 for r in loads.values())
    prefill = sections["prefill"]
    assert set(prefill["single"]) == {str(n) for n in SMOKE.prefill_lens}
    assert set(prefill["multi"]) == {"0", "8"}
    assert all(v["status"] == "ok" for v in [*prefill["single"].values(), *prefill["multi"].values()])
    assert prefill["mixed"]["status"] == "ok" and prefill["mixed"]["tokens"] == 7 + 16


def test_the_step_loop_runs_the_engine_order_with_and_without_staging_ahead(smoke: dict[str, Any]) -> None:
    loop = smoke["report"]["sections"]["step_loop"]
    assert loop["path"] == "eager" and loop["batch"] == 32
    assert all(v > 0 for v in loop["median_s"].values()) and loop["after_over_before"] > 0
    # every staged step but each run's last was taken up by the next one
    assert loop["staging"]["ahead_used"] == gpu_check.step_loop.LOOP_REPEATS * (loop["steps"] - 1)
    assert "launch_syncs" not in loop and not loop["staging"].get(
        "copy_waits"
    )  # no copy is in flight on a CPU
    assert "step_loop" in smoke["stdout"]


def test_the_calibration_file_carries_the_measured_steps_into_the_simulator(smoke: dict[str, Any]) -> None:
    report, path = smoke["report"], smoke["calibration"]
    data = json.loads(path.read_text())
    context = SMOKE.calibration_context
    measured = {
        (p["batch"], p["distinct"]): p["median_s"]
        for p in report["sections"]["decode"]["eager"]["points"]
        if p["context"] == context
    }
    in_file = {
        (run["batch"], int(d)): v["median"] for run in data["runs"] for d, v in run["decode_step_s"].items()
    }
    assert in_file == measured
    assert RAM_TIER in LOAD_S
    ram_s = report["sections"]["slot_load"]["by_rank"]["16"]["median_s"]
    timing = load_timing([path])
    assert timing.load_s[RAM_TIER] == ram_s
    # The simulator fits its step model to these steps by least squares over batch and distinct counts:
    # step_s(32, 32) is that fit of exactly the measured steps (the steps of a smoke run on a shared CPU
    # are too noisy for the fit to pass near each one; test_a_linear_step_comes_back_exactly covers that).
    fitted = fit_steps(TimingModel(), data["runs"])
    assert timing.step_s(32, 32) == pytest.approx(fitted.step_s(32, 32), rel=1e-12)
    assert timing.max_batch == max(SMOKE.batches)


def test_a_step_the_simulator_can_fit_exactly_comes_back_from_the_calibration_exactly(tmp_path: Path) -> None:
    def step_s(batch: int, distinct: int) -> float:  # linear in batch and distinct: the fit is exact
        return 0.010 + 0.0002 * batch + 0.0003 * distinct

    points = [
        dict(batch=b, context=1024, distinct=d, status="ok", median_s=step_s(b, d))
        for b in (1, 8, 32, 64)
        for d in (0, 1, 8, 32)
        if d <= b
    ]
    prefill = {"single": {"2048": dict(status="ok", sequences=1, tokens=2048, median_s=0.25)}}
    slot_load = {"by_rank": {"16": dict(median_s=0.004)}}
    report = dict(
        mode="full",
        device="test",
        calibration_context=1024,
        sections=dict(decode={"eager": {"points": points}}, prefill=prefill, slot_load=slot_load),
    )
    data = calibration(report)
    assert data is not None
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(data))
    timing = load_timing([path])
    assert timing.step_s(32, 32) == pytest.approx(step_s(32, 32), rel=1e-9)
    assert timing.step_s(64, 8) == pytest.approx(step_s(64, 8), rel=1e-9)
    assert timing.load_s[RAM_TIER] == 0.004
    assert timing.prefill_tokens_per_s == pytest.approx(2048 / (0.25 - timing.step_s(1, 0)))


def test_simulate_runs_on_the_calibration_and_reports_its_timing(
    smoke: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the default HTML report goes under the working directory
    app = typer.Typer()
    app.command("simulate")(simulate_cmd)
    app.command("noop")(lambda: None)  # two commands, so typer keeps the command name
    small = ["simulate", "--replicas", "4", "--adapters", "100", "--rate", "1", "--duration", "30"]
    small += ["--warmup", "5", "--json"]
    default = CliRunner().invoke(app, small)
    calibrated = CliRunner().invoke(app, [*small, "--calibration", str(smoke["calibration"])])
    assert default.exit_code == 0 and calibrated.exit_code == 0, calibrated.output
    before, after = json.loads(default.output)["timing"], json.loads(calibrated.output)["timing"]
    assert after != before
    assert after["load_s"][RAM_TIER] == smoke["report"]["sections"]["slot_load"]["by_rank"]["16"]["median_s"]
    assert after["max_batch"] == max(SMOKE.batches)


def section_that_raises(exc: BaseException) -> gpu_check.Section:
    def section(bench: Bench, out: dict[str, Any]) -> None:
        raise exc

    return section


def test_the_report_holds_the_first_section_when_a_later_one_is_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "report.json"
    monkeypatch.setitem(gpu_check.SECTIONS, "model", section_that_raises(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        gpu_check.main(["--cpu-smoke", "--out", str(out), "--sections", "kernels,model,kv_blocks"])
    sections = json.loads(out.read_text())["sections"]
    assert sections["kernels"]["status"] == "ok" and sections["kernels"]["lora"]
    assert sections["model"]["status"] == "failed: interrupted"
    assert "kv_blocks" not in sections


def test_a_failing_section_is_recorded_and_the_next_one_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "report.json"
    monkeypatch.setitem(gpu_check.SECTIONS, "kernels", section_that_raises(RuntimeError("boom")))
    report = gpu_check.main(["--cpu-smoke", "--out", str(out), "--sections", "kernels,model,kv_blocks"])
    assert json.loads(out.read_text()) == json.loads(json.dumps(report, default=str))
    sections = report["sections"]
    assert sections["kernels"]["status"] == "failed: RuntimeError: boom"
    assert sections["model"]["status"] == "ok" and sections["kv_blocks"]["status"] == "ok"
    assert not (tmp_path / "report.calibration.json").exists()  # no decode step measured


def test_past_the_deadline_sections_and_grid_points_are_skipped_and_marked(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    report = gpu_check.main(["--cpu-smoke", "--out", str(out), "--sections", "kernels", "--deadline-s", "0"])
    assert report["sections"]["kernels"]["status"] == "skipped: deadline"
    bench = Bench(SMOKE, torch.device("cpu"), {"sections": {}}, lambda: None, time.monotonic() + 60)
    model.build(bench, {})
    bench.deadline = time.monotonic()
    out_decode: dict[str, Any] = {}
    decode.measure(bench, out_decode)
    points = out_decode["eager"]["points"]
    assert points and all(p["status"] == "skipped: deadline" for p in points)
    report = {"sections": {"decode": out_decode}, "calibration_context": SMOKE.calibration_context}
    assert calibration({**report, "mode": "cpu-smoke", "device": "cpu"}) is None


def test_the_calibration_takes_a_batch_from_the_captured_path_where_it_measured_it() -> None:
    def points(batches: tuple[int, ...], seconds: float) -> list[dict[str, Any]]:
        return [
            dict(batch=b, context=64, distinct=d, status="ok", median_s=seconds)
            for b in batches
            for d in (0, 1)
        ]

    decode_section = {"eager": {"points": points((1, 32), 0.02)}, "captured": {"points": points((32,), 0.01)}}
    report = dict(mode="full", device="test", calibration_context=64, sections={"decode": decode_section})
    data = calibration(report)
    assert data is not None
    runs = {run["batch"]: run for run in data["runs"]}
    assert runs[1]["decode_path"] == "eager" and runs[1]["decode_step_s"]["1"] == {"median": 0.02}
    assert runs[32]["decode_path"] == "captured" and runs[32]["decode_step_s"]["1"] == {"median": 0.01}
