"""The HTML reports the console links to: the configured report files that exist, each titled by its own
<title> and dated by its modification time."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from schemas.console import ReportLink

# The latest report of each kind, where its command writes it (relative to the stack's working directory).
REPORT_PATHS = (
    Path(".data/loadtest/report/report.html"),
    Path(".data/sim/report.html"),
    Path("bench/results/simgrid.html"),
)

_TITLE = re.compile(r"<title>([^<]{1,200})</title>", re.IGNORECASE)


def report_title(path: Path) -> str:
    """The page's <title> (read from its head), else its file name."""
    with path.open(encoding="utf-8", errors="replace") as f:
        found = _TITLE.search(f.read(4096))
    return found.group(1).strip() if found else path.name


def report_links(paths: Sequence[Path], prefix: str) -> list[ReportLink]:
    """A link per existing report; its url is prefix/<index in paths>/, so only listed files are served."""
    out = []
    for index, path in enumerate(paths):
        if path.is_file():
            modified = datetime.fromtimestamp(path.stat().st_mtime, UTC)
            out.append(
                ReportLink(
                    name=path.name, title=report_title(path), url=f"{prefix}/{index}/", modified=modified
                )
            )
    return out
