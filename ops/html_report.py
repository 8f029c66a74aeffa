"""A report as one HTML page: a JSON report's numbers as tables, and its PNG plots beside it (pure).

Layout: the top-level scalars form a summary table; a dict becomes a two-column table of its flattened
leaves, or a table with one row per key when its values are dicts themselves (runs by routing mode, sizing by
replica count); a list of dicts becomes a table with one row per item. Plots are linked by file name, so the
page opens from its folder and from the console (which serves the PNGs beside it). Text is escaped.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

Scalar = str | int | float | bool | None

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; color: #1d2330; margin: 24px; max-width: 1400px; }
h1 { font-size: 22px; } h2 { font-size: 17px; margin-top: 28px; }
table { border-collapse: collapse; margin: 8px 0; font-size: 13px; }
th, td { border: 1px solid #d9dde5; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #eef1f6; } td.n { text-align: right; font-variant-numeric: tabular-nums; }
img { max-width: 100%; border: 1px solid #d9dde5; margin: 8px 0; }
.muted { color: #6b7280; }
.wrap { overflow-x: auto; }
"""


def flatten(value: Mapping[str, Any], prefix: str = "") -> dict[str, Scalar]:
    """Nested dicts as dotted keys; a list of scalars joined with commas; a list of dicts as JSON."""
    out: dict[str, Scalar] = {}
    for key, v in value.items():
        name = f"{prefix}{key}"
        if isinstance(v, Mapping):
            out.update(flatten(v, f"{name}."))
        elif isinstance(v, list):
            scalars = all(not isinstance(i, Mapping | list) for i in v)
            out[name] = ", ".join(str(i) for i in v) if scalars else json.dumps(v)
        else:
            out[name] = v
    return out


def _cell(v: Scalar) -> str:
    if isinstance(v, bool) or v is None:
        return f"<td>{'-' if v is None else html.escape(str(v))}</td>"
    if isinstance(v, int | float):
        text = f"{v:.4g}" if isinstance(v, float) else str(v)
        return f'<td class="n">{text}</td>'
    return f"<td>{html.escape(v)}</td>"


def table(rows: Sequence[Mapping[str, Scalar]], first: str | None = None) -> str:
    """One row per mapping, columns in first-seen order (first, when given, leads)."""
    columns: list[str] = [first] if first else []
    for row in rows:
        columns += [c for c in row if c not in columns]
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(_cell(row.get(c)) for c in columns) + "</tr>" for row in rows)
    return f'<div class="wrap"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def pairs(values: Mapping[str, Scalar]) -> str:
    body = "".join(f"<tr><th>{html.escape(k)}</th>{_cell(v)}</tr>" for k, v in values.items())
    return f"<table><tbody>{body}</tbody></table>"


def section(name: str, value: Any) -> str:
    """The table for one top-level entry of the report."""
    if isinstance(value, Mapping):
        if value and all(isinstance(v, Mapping) for v in value.values()):
            rows = [{"": k, **flatten(v)} for k, v in value.items()]
            return table(rows, first="")
        return pairs(flatten(value))
    if isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
        return table([flatten(v) for v in value])
    return pairs(flatten({name: value}))


def render(title: str, report: Mapping[str, Any], images: Iterable[str] = (), intro: str = "") -> str:
    """The page: title, intro, the plots (file names beside it), the summary, then a table per section."""
    scalars = {k: v for k, v in report.items() if not isinstance(v, Mapping | list)}
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
    ]
    if intro:
        parts.append(f'<p class="muted">{html.escape(intro)}</p>')
    for name in images:
        parts.append(f'<figure><img src="{html.escape(name)}" alt="{html.escape(name)}"></figure>')
    if scalars:
        parts += ["<h2>Summary</h2>", pairs(scalars)]
    for key, value in report.items():
        if key not in scalars:
            parts += [f"<h2>{html.escape(key)}</h2>", section(key, value)]
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def write(
    out: Path, title: str, report: Mapping[str, Any], images: Iterable[str] = (), intro: str = ""
) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(title, report, images, intro))
    return out
