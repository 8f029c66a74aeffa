"""`lorafleet report html`: a JSON report (simulator, sim grid, load test) as one HTML page by its plots."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from ops import html_report

app = typer.Typer(no_args_is_help=True)


@app.callback()
def _group() -> None:
    """HTML reports."""


@app.command("html")
def html_cmd(
    report: Annotated[
        Path, typer.Argument(help="The JSON report (lorafleet simulate --out, bench simgrid, ...).")
    ],
    out: Annotated[Path, typer.Option(help="The HTML page to write.")] = Path(".data/sim/report.html"),
    title: Annotated[str, typer.Option(help="The page's title.")] = "Simulator report",
    png: Annotated[
        list[Path] | None,
        typer.Option(help="A plot to show (repeatable); copied beside the page if elsewhere."),
    ] = None,
) -> None:
    """Write the page: the plots first, then the report's numbers as tables."""
    data = json.loads(report.read_text())
    if not isinstance(data, dict):
        raise typer.BadParameter("the report must be a JSON object", param_hint="REPORT")
    out.parent.mkdir(parents=True, exist_ok=True)
    names = []
    for plot in png or []:
        beside = out.parent / plot.name
        if plot.resolve() != beside.resolve():
            beside.write_bytes(plot.read_bytes())
        names.append(plot.name)
    html_report.write(out, title, data, names, intro=f"From {report}.")
    typer.echo(str(out))
