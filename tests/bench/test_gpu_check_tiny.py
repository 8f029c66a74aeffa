"""The prepared GPU check runs end to end on CPU with --tiny and writes a complete report."""

from __future__ import annotations

import json
from pathlib import Path

from bench import gpu_check


def test_tiny_run_checks_kernels_and_measures_every_case(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    gpu_check.main(["--tiny", "--out", str(out)])
    report = json.loads(out.read_text())
    assert report["shape"] == "tiny" and report["implementation"] == "torch"
    assert report["kernel_checks"] and all(row["ok"] for row in report["kernel_checks"])
    assert {row["launch"] for row in report["kernel_checks"]} == {"gathered", "segmented"}
    eager = report["decode_tokens_per_s"]["eager"]
    assert set(eager) == {"0", "1", "8", "32"} and all(v > 0 for v in eager.values())
    assert set(report["prefill_tokens_per_s"]) == {"0", "1", "8"}
    floor = report["bytes_floor_ratio"]
    assert floor["0"] == 1.0 and floor["32"] < floor["8"] < floor["1"] < 1.0
