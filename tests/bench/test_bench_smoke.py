"""Each benchmark runs end to end at a tiny size and prints the JSON its readers expect (no timing asserted)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bench.cli import app
from bench.lora import byte_bound

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _run(args: list[str]) -> dict:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout[result.stdout.index("{") :])


def test_byte_bound_matches_the_design_example() -> None:
    # rank 16 on 4096x4096 costs +0.8% per distinct adapter in bytes read
    assert byte_bound(4096, 4096, 16, 1) == pytest.approx(1.0078, abs=1e-4)
    assert byte_bound(4096, 4096, 16, 32) == pytest.approx(1.25)


def test_lora_bench_reports_one_row_per_shape_and_adapter_count() -> None:
    args = ["lora", "--shapes", "64x64,96x32", "--rows", "4", "--rank", "4", "--distinct", "1,2,4"]
    out = _run([*args, "--repeats", "2", "--inner", "1", "--device", "cpu"])
    assert out["benchmark"] == "lora" and out["environment"]["dtype"] == "float32"
    assert [(r["shape"], r["distinct_adapters"]) for r in out["results"]] == [
        (s, d) for s in ("64x64", "96x32") for d in (1, 2, 4)
    ]
    for row in out["results"]:
        assert row["ratio"] > 0 and row["byte_bound"] == pytest.approx(
            byte_bound(*map(int, row["shape"].split("x")), 4, row["distinct_adapters"]), abs=1e-4
        )


@pytest.mark.slow
def test_engine_bench_reports_ratios_memory_and_calibration(tmp_path: Path) -> None:
    calib = tmp_path / "calibration.json"
    args = [
        "engine",
        "--new-tokens",
        "3",
        "--batch",
        "2",
        "--distinct",
        "0,2",
        "--rounds",
        "1",
        "--device",
        "cpu",
    ]
    out = _run([*args, "--calibration-out", str(calib)])
    assert set(out["decode_tokens_per_s"]) == {
        "ours_0_adapters",
        "ours_2_adapters",
        "transformers_generate",
        "peft_mixed_generate",
    }
    assert set(out["ratios"]) == {
        "adapters32_over_base",
        "base_over_transformers",
        "adapters32_over_peft_mixed",
    }
    assert out["memory"]["peak_rss_mib"] > 0
    weights = out["weight_bytes_per_decode_step"]  # SmolLM2: 2 rank-16 all-module adapters = 37 MiB
    assert weights["adapter_mib"] == pytest.approx(18.63, abs=0.01) and weights["base_mib"] == pytest.approx(
        513.0
    )
    assert weights["memory_bound_ceiling"] == pytest.approx(1 / (1 + 2 * 18.63 / 513.0), abs=1e-3)
    # fp32 greedy decoding agrees with the references row for row
    assert out["greedy_rows_identical"] == {"ours_base_vs_transformers": 1.0, "ours_2_vs_peft_mixed": 1.0}
    cal = json.loads(calib.read_text())
    assert set(cal["decode_step_s"]) == {"0", "2"} and cal["prefill"]["0"]["tokens_per_s"] > 0


def test_load_bench_times_each_tier_through_the_cache_beside_its_floor(tmp_path: Path) -> None:
    out = _run(["load", "--repeats", "1", "--device", "cpu", "--no-s3", "--out", str(tmp_path / "load.json")])
    assert out["benchmark"] == "load" and out["target_ratio"] == 1.2
    assert set(out["tiers"]) == {"ram", "disk", "remote"} == set(out["summary"])
    for tier in out["tiers"].values():
        assert tier["median_s"] > 0 and tier["floor_median_s"] > 0
        assert tier["ratio"] == tier["median_s"] / tier["floor_median_s"]
        assert tier["within_1_2x"] == (tier["ratio"] <= 1.2)
    assert json.loads((tmp_path / "load.json").read_text()) == out


def test_spool_size_reports_the_bytes_its_events_take() -> None:
    got = _run(["spool-size", "--events", "2000", "--batch", "300"])
    assert got["events"] == 2000 and got["event_bytes"] > 200
    assert got["spool_bytes"] >= got["events"] * got["event_bytes"]  # a row holds the event, key and topic


@pytest.mark.slow
def test_constrained_bench_reports_both_rates_and_first_token_times() -> None:
    args = ["constrained", "--batch", "2", "--json-rows", "1", "--new-tokens", "3", "--rounds", "1"]
    out = _run([*args, "--ttft-repeats", "1", "--device", "cpu"])
    assert set(out["decode_tokens_per_s"]) == {"plain", "constrained"}
    assert out["constrained_over_plain"] > 0
    assert set(out["first_token_ms"]) == {"new_schema", "cached_schema"}
    assert out["grammar_cache"]["hits"] >= 1
