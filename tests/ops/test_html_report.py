import json
from pathlib import Path

from typer.testing import CliRunner

from ops.html_report import flatten, render, section
from ops.report_cli import app


def test_flatten_dots_nested_keys_and_joins_scalar_lists() -> None:
    report = {"ttft": {"p50_s": 0.1, "by": {"gpu": 2}}, "rates": [1, 2], "runs": [{"a": 1}]}
    assert flatten(report) == {"ttft.p50_s": 0.1, "ttft.by.gpu": 2, "rates": "1, 2", "runs": '[{"a": 1}]'}


def test_a_dict_of_dicts_is_one_row_per_key_and_a_list_of_dicts_one_row_per_item() -> None:
    by_mode = section("runs", {"cost": {"p95": 0.3}, "random": {"p95": 0.9}})
    assert by_mode.count("<tr>") == 3 and "<td>cost</td>" in by_mode and '<td class="n">0.9</td>' in by_mode
    rows = section("rates", [{"rate": 1, "ok": 5}, {"rate": 2, "ok": 9, "extra": "x"}])
    assert "<th>extra</th>" in rows and rows.count("<tr>") == 3


def test_the_page_escapes_text_and_links_its_plots() -> None:
    page = render("Sim <grid>", {"gateway": "<script>", "cells": 3}, ["ttft.png"])
    assert "<title>Sim &lt;grid&gt;</title>" in page
    assert "&lt;script&gt;" in page and "<script>" not in page
    assert '<img src="ttft.png"' in page


def test_report_html_writes_the_page_and_copies_its_plots_beside_it(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    report, plot = tmp_path / "in" / "sim.json", tmp_path / "in" / "grid.png"
    report.write_text(json.dumps({"replicas": 26, "ttft": {"p95_s": 0.4}}))
    plot.write_bytes(b"\x89PNG\r\n\x1a\n")
    out = tmp_path / "out" / "report.html"
    result = CliRunner().invoke(
        app, ["html", str(report), "--out", str(out), "--png", str(plot), "--title", "Sim"]
    )
    assert result.exit_code == 0, result.output
    page = out.read_text()
    assert "<title>Sim</title>" in page and "<h2>ttft</h2>" in page and '<img src="grid.png"' in page
    assert (tmp_path / "out" / "grid.png").read_bytes() == plot.read_bytes()
