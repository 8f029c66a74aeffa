"""The KV benchmarks run end to end at a small size and print the JSON their docs quote (no timing asserted)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from bench.cli import app


def _run(args: list[str]) -> dict:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout[result.stdout.index("{") :])


def test_capacity_counts_whole_sequences_in_blocks_against_contiguous_rows(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"] + [
        f"2023-11-16 18:15:{i:02d},{100 + i},{20}" for i in range(40)
    ]
    trace.write_text("\n".join(rows) + "\n")
    out = _run(
        ["kv-capacity", "--trace", str(trace), "--budget-tokens", "2048", "--max-model-len", "512,1024"]
    )
    first, second = out["runs"]
    assert (first["contiguous_rows"], second["contiguous_rows"]) == (4, 2)
    # sequences of 120-159 tokens take 8-10 blocks of 16: 12 to 16 of them fit 128 blocks
    assert 12 <= first["paged_sequences_min"] <= first["paged_sequences_median"] <= 16
    assert second["paged_over_contiguous"] == second["paged_sequences_median"] / 2


def test_stall_reports_each_chunk_budget_and_the_unchunked_run() -> None:
    out = _run(["kv-stall", "--chunks", "64", "--long-prompt", "150", "--repeats", "1"])
    chunked, whole = out["runs"]
    assert chunked["chunk_tokens"] == 64 and whole["chunk_tokens"] is None
    # 150 prompt tokens and 4 decoding rows: 60 prompt tokens a step take three steps; unchunked, one
    assert (
        chunked["steps_until_long_prompt_first_token"] == 3
        and whole["steps_until_long_prompt_first_token"] == 1
    )
    assert whole["gap_over_unchunked"] == 1.0 and chunked["longest_stream_gap_ms"] > 0
    assert chunked["gap_over_own_max_step_max"] < 1.05  # no stream waited past the step it ran beside
