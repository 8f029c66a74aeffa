"""The report's PNG plots come from summary.json: the numbers drawn are the summary's, the files are PNGs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from matplotlib.image import imread

from loadtest import plots


def rate_row(rate: float, p50: float, gpu_hit: float, loads: float) -> dict:
    return {
        "rate": rate,
        "ttft": {"p50_s": p50, "p95_s": 2 * p50},
        "ttft_by_tier": {"gpu": {"p50_s": p50 / 2, "p95_s": p50}, "ram": {"p50_s": p50 * 3, "p95_s": p50 * 4}}
        if rate < 2
        else {"gpu": {"p50_s": p50 / 2, "p95_s": p50}},
        "tpot": {"p50_s": 0.1 * rate, "p95_s": 0.2 * rate},
        "gpu_hit_rate": gpu_hit,
        "ram_hit_rate": 1.0 if gpu_hit < 1 else None,
        "replica_cache_per_min": {"replica-0": {"gpu_loads": loads, "gpu_evictions": loads / 2}},
    }


SUMMARY = {
    "rates": [rate_row(1.0, 0.4, 0.8, 6.0), rate_row(2.0, 0.9, 1.0, 0.0)],
    "burst": {"size": 32, "tokens_per_s": {"1": 100.0, "8": 90.0, "32": 80.0}},
}


def test_series_are_the_summary_numbers() -> None:
    data = plots.series(SUMMARY)
    assert data["ttft"]["x"] == [1.0, 2.0]
    assert data["ttft"]["lines"]["all p95"] == [0.8, 1.8]
    assert data["ttft"]["lines"]["ram p50"] == [pytest.approx(1.2), None]  # no RAM-tier request at rate 2
    assert data["tpot"]["lines"]["p50"] == [0.1, 0.2]
    assert data["hit_rates"]["lines"]["GPU"] == [0.8, 1.0]
    assert data["cache_per_min"]["lines"]["replica-0 gpu_evictions"] == [3.0, 0.0]
    assert data["cache_per_min"]["lines"]["replica-0 ram_evictions"] == [0.0, 0.0]
    assert data["burst"]["x"] == [1, 8, 32] and data["burst"]["lines"]["tokens/s (median)"] == [100, 90, 80]


def test_figures_draw_those_numbers() -> None:
    figs = plots.figures(plots.series(SUMMARY))
    lines = {line.get_label(): line for line in figs["ttft"].axes[0].get_lines()}
    assert list(lines["all p50"].get_ydata()) == [0.4, 0.9]
    assert list(lines["ram p95"].get_xdata()) == [1.0]  # the missing point is left out, not drawn as 0
    burst = figs["burst"].axes[0].get_lines()[0]
    assert list(burst.get_xdata()) == [1, 8, 32] and list(burst.get_ydata()) == [100, 90, 80]


def test_write_saves_pngs_and_the_plotted_numbers(tmp_path: Path) -> None:
    names = plots.write(SUMMARY, tmp_path)
    assert names == ["ttft.png", "tpot.png", "hit_rates.png", "cache_per_min.png", "burst.png"]
    for name in names:
        image = imread(tmp_path / name)  # decodes, so the file is a whole PNG
        assert image.shape[:2] == (400, 640)
        assert image[..., :3].std() > 0  # something is drawn
    assert json.loads((tmp_path / "plots.json").read_text()) == json.loads(json.dumps(plots.series(SUMMARY)))
