"""Trace files (sim.trace): the CSV reader, its errors, rate rescaling, windows and the Zipf assignment;
and `lorafleet simulate --trace --find-replicas` on a window of the shared production trace."""

from __future__ import annotations

import json
import statistics
from collections import Counter
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from sim import trace as traces
from sim.cli import simulate_cmd
from sim.workload import Request, adapter_id, save

SHARED_TRACE = Path(__file__).resolve().parents[2] / ".." / "shared" / "traces" / "azure_conv_2023.csv"

CSV = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:51.0000001,879,55

2023-11-16 18:16:46.6805900,1020,129
"""

app = typer.Typer()
app.command("simulate")(simulate_cmd)
app.command("noop")(lambda: None)  # two commands, so typer keeps the command name


def write(tmp_path: Path, text: str, name: str = "trace.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def arrivals(times: list[float]) -> list[Request]:
    return [Request(i, t, "", 100, 10) for i, t in enumerate(times)]


def test_csv_rows_become_requests_timed_from_the_first_arrival_to_the_tenth_of_a_microsecond(
    tmp_path: Path,
) -> None:
    got = traces.read(write(tmp_path, CSV))
    assert [(r.prompt_tokens, r.output_tokens) for r in got] == [
        (374, 44),
        (396, 109),
        (879, 55),
        (1020, 129),
    ]
    assert [r.request_id for r in got] == [0, 1, 2, 3]
    assert got[0].arrival_s == 0.0
    assert got[1].arrival_s == pytest.approx(4.314579, abs=1e-6)
    assert got[2].arrival_s == pytest.approx(4.3194101, abs=1e-6)  # 7 fractional digits kept
    assert got[3].arrival_s == pytest.approx(60.0, abs=1e-6)
    assert all(r.adapter_id == "" for r in got)


def test_any_csv_with_the_three_columns_is_read_whatever_else_it_holds(tmp_path: Path) -> None:
    text = (
        "id,GeneratedTokens,TIMESTAMP,ContextTokens\n7,5,2023-11-16T18:15:47Z,9\n8,6,2023-11-16 18:15:46,3\n"
    )
    got = traces.read(write(tmp_path, text))
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in got] == [(0.0, 3, 6), (1.0, 9, 5)]


def test_timestamps_parse_with_any_fraction_a_zone_or_as_seconds() -> None:
    base = traces.parse_timestamp("2023-11-16 18:15:46")
    assert traces.parse_timestamp("2023-11-16 18:15:46.6805900") - base == pytest.approx(0.68059)
    assert traces.parse_timestamp("2023-11-16T18:15:46.123456789") - base == pytest.approx(0.123456789)
    assert traces.parse_timestamp("2023-11-16 19:15:46+01:00") == base
    assert traces.parse_timestamp("12.5") == 12.5
    for bad in ("yesterday", "2023-13-16 18:15:46", "nan"):
        with pytest.raises(ValueError):
            traces.parse_timestamp(bad)


def test_a_missing_column_names_the_file_the_line_and_the_column(tmp_path: Path) -> None:
    path = write(tmp_path, "TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.6805900,374\n")
    with pytest.raises(traces.TraceError, match=rf"^{path}:1: missing column GeneratedTokens"):
        traces.read(path)


@pytest.mark.parametrize(
    ("row", "column"),
    [
        ("2023-11-16 18:15:46.1,12x,44", "ContextTokens"),
        ("2023-11-16 18:15:46.1,12,-4", "GeneratedTokens"),
        ("not a time,12,44", "TIMESTAMP"),
        ("2023-11-16 18:15:46.1,12", "GeneratedTokens"),
    ],
)
def test_a_bad_row_names_the_file_its_line_and_the_column(tmp_path: Path, row: str, column: str) -> None:
    path = write(tmp_path, CSV + row + "\n")
    with pytest.raises(traces.TraceError, match=rf"^{path}:7: column {column}: "):
        traces.read(path)


def test_jsonl_traces_are_still_read_as_written(tmp_path: Path) -> None:
    want = [Request(0, 0.5, adapter_id(3), 10, 20, "tenant-00003"), Request(1, 1.5, adapter_id(0), 30, 40)]
    save(want, tmp_path / "t.jsonl")
    assert traces.read(tmp_path / "t.jsonl") == want
    (tmp_path / "bad.jsonl").write_text(json.dumps({"request_id": 0}) + "\n")
    with pytest.raises(traces.TraceError, match=r"bad.jsonl:1: not a trace request"):
        traces.read(tmp_path / "bad.jsonl")


def test_rescaling_hits_the_mean_rate_and_keeps_the_burst_shape() -> None:
    trace = arrivals([0.0, 0.1, 0.2, 5.0, 5.05, 20.0, 20.5, 30.0])  # bursts and lulls
    factor = traces.time_factor(trace, 4.0)
    fast = traces.rescale(trace, factor)
    assert traces.mean_rate(fast) == pytest.approx(4.0)
    gaps = [b.arrival_s - a.arrival_s for a, b in zip(trace, trace[1:], strict=False)]
    fast_gaps = [b.arrival_s - a.arrival_s for a, b in zip(fast, fast[1:], strict=False)]
    assert [g / gaps[0] for g in gaps] == pytest.approx([g / fast_gaps[0] for g in fast_gaps])
    assert statistics.pstdev(fast_gaps) / statistics.mean(fast_gaps) == pytest.approx(
        statistics.pstdev(gaps) / statistics.mean(gaps)
    )


def test_the_window_starts_at_the_offset_on_the_traces_clock_and_lasts_duration_on_the_replays() -> None:
    trace = arrivals([float(t) for t in range(100)])  # 1 req/s
    cfg = traces.ReplayConfig(rate=2.0, duration_s=10.0, offset_s=40.0, adapters=10)
    got = traces.shape(trace, cfg)
    assert [r.arrival_s for r in got] == pytest.approx([i / 2 for i in range(20)])
    assert [r.request_id for r in got] == list(range(20))
    assert traces.window(trace, 5.0, 90.0)[0].arrival_s == 0.0 and len(traces.window(trace, 5.0, 90.0)) == 5
    assert len(traces.window(trace, 0.0, 0.0)) == 100  # no duration: to the end


def test_adapters_come_from_a_seeded_skewed_zipf_mix_and_each_adapter_has_one_tenant() -> None:
    trace = arrivals([i * 0.01 for i in range(20_000)])
    one = traces.assign(trace, adapters=1000, zipf_s=1.0, tenants=50, seed=3)
    assert one == traces.assign(trace, adapters=1000, zipf_s=1.0, tenants=50, seed=3)
    assert one != traces.assign(trace, adapters=1000, zipf_s=1.0, tenants=50, seed=4)
    counts = Counter(r.adapter_id for r in one)
    top = counts.most_common(10)
    assert top[0][0] == adapter_id(0)
    assert sum(c for _, c in top) / len(one) > 0.3  # 1% of adapters, about 39% of Zipf(1.0) traffic
    owners = {r.adapter_id: r.tenant for r in one}
    assert len(set(owners.values())) == 50
    assert all(owners[a] == f"tenant-{int(a.split('-')[1]) % 50:05d}" for a in owners)
    assert {r.tenant for r in traces.assign(trace[:50], 5, 1.0, 0, 0)} <= {
        f"tenant-{i:05d}" for i in range(5)
    }


def test_simulate_rejects_a_bad_trace_with_its_line_and_no_traceback(tmp_path: Path) -> None:
    path = write(tmp_path, CSV + "2023-11-16 18:17:00,oops,1\n")
    args = ["simulate", "--trace", str(path), "--html", str(tmp_path / "r.html")]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "400"})  # the error box on one line
    assert result.exit_code == 2
    assert "trace.csv:7: column ContextTokens: not a whole number of tokens: 'oops'" in result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


@pytest.mark.skipif(
    not SHARED_TRACE.is_file(), reason=f"the shared production trace is absent: {SHARED_TRACE}"
)
def test_find_replicas_on_two_minutes_of_the_production_trace_gives_a_fleet_and_its_cost(
    tmp_path: Path,
) -> None:
    args = ["simulate", "--trace", str(SHARED_TRACE), "--rate", "20", "--duration", "120"]
    args += ["--adapters", "500", "--zipf", "0.9", "--tenants", "100", "--warmup", "10", "--replicas", "8"]
    result = CliRunner().invoke(app, [*args, "--find-replicas", "--json", "--html", str(tmp_path / "r.html")])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["trace"]["source_requests"] == 19_366
    assert 0 < report["trace"]["span_s"] < 120 and report["trace"]["requests"] > 1000
    assert report["replicas"] >= 1 and report["ttft"]["p95_s"] <= 1.0
    assert report["cost"]["usd_per_million_tokens"] > 0
    tenants = report["report"]["ttft_by_tenant"]
    assert tenants["tenants"] <= 100 and len(tenants["top"]) == 5 and tenants["worst"]["p95_ttft_s"] > 0
