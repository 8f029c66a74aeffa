"""Trace files that both the simulator and the load test replay, and how a replay is shaped from one.

Two formats, told apart by their first non-blank character:
- CSV with a header holding `TIMESTAMP`, `ContextTokens` and `GeneratedTokens` (the Azure LLM inference
  trace; other columns are ignored). A timestamp is ISO 8601 with any number of fractional digits
  (`2023-11-16 18:15:46.6805900`) or plain seconds. Rows carry no adapter or tenant: `shape` assigns them.
- JSONL of `sim.workload.Request` objects (`--trace-out` writes it), replayed with their own adapters.

Shaping a replay (`shape`), in this order:
1. the offset skips the first `offset_s` seconds of the trace's own clock;
2. the rate rescales every inter-arrival gap by one factor, so that the whole trace's mean rate becomes
   `rate` (requests - 1 over the span of arrivals); bursts keep their shape, and a window keeps its
   intensity relative to the trace's mean (a busy ten minutes stays busy);
3. the duration keeps arrivals before `duration_s` seconds of the replay's (rescaled) clock;
4. CSV rows get an adapter from a Zipf mix (`adapters`, `zipf_s`) drawn from `seed`, and each adapter
   its tenant by `sim.workload.tenant_id`: the adapter of popularity rank r belongs to tenant r mod
   `tenants`, so tenant 0 owns the most popular adapter, and with as many tenants as adapters each
   tenant owns one.
"""

from __future__ import annotations

import bisect
import csv
import itertools
import json
import math
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

from sim.workload import Request, adapter_id, tenant_id, zipf_weights

TIMESTAMP = "TIMESTAMP"
PROMPT = "ContextTokens"
OUTPUT = "GeneratedTokens"
COLUMNS = (TIMESTAMP, PROMPT, OUTPUT)
T = TypeVar("T")

_ISO = re.compile(
    r"(?P<base>\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}(?::\d{2})?)"  # date and time to the second
    r"(?:[.,](?P<frac>\d+))?"  # any number of fractional digits
    r"\s*(?P<tz>Z|[+-]\d{2}:?\d{2})?"
)


class TraceError(ValueError):
    """A trace file that cannot be read; the message names the file, the line and the column."""


@dataclass(frozen=True)
class ReplayConfig:
    rate: float = 0.0  # mean requests/s of the whole trace after rescaling; 0 keeps the trace's clock
    duration_s: float = 0.0  # seconds of the replay's clock to keep; 0 keeps all
    offset_s: float = 0.0  # seconds of the trace's own clock to skip first
    adapters: int = 5000
    zipf_s: float = 1.0
    tenants: int = 0  # 0: one tenant per adapter
    seed: int = 0


def parse_timestamp(text: str) -> float:
    """Seconds since the epoch (UTC when no zone is given) of an ISO 8601 time or a plain number."""
    text = text.strip()
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        if not math.isfinite(seconds):
            raise ValueError(f"not a timestamp: {text!r}")
        return seconds
    m = _ISO.fullmatch(text)
    if m is None:
        raise ValueError(f"not a timestamp: {text!r}")
    tz = m["tz"]
    zone = "" if not tz else "+00:00" if tz == "Z" else tz
    base = datetime.fromisoformat(m["base"].replace(" ", "T") + zone)  # ValueError for a bad date
    if base.tzinfo is None:
        base = base.replace(tzinfo=UTC)
    frac = m["frac"]
    # Kept as digits, not through datetime, which holds microseconds only and refuses some digit counts.
    return base.timestamp() + (int(frac) / 10 ** len(frac) if frac else 0.0)


def _count(text: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise ValueError(f"not a whole number of tokens: {text.strip()!r}") from None
    if value < 0:
        raise ValueError(f"negative token count {value}")
    return value


def read_csv(path: Path) -> list[Request]:
    """Requests of a CSV trace, in arrival order, with times from its first arrival; adapters unassigned."""
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        header = [h.strip() for h in reader.fieldnames or []]
        missing = [c for c in COLUMNS if c not in header]
        if missing:
            raise TraceError(
                f"{path}:1: missing column {', '.join(missing)} (found {', '.join(header) or 'no header'}; "
                f"a trace needs {', '.join(COLUMNS)})"
            )
        reader.fieldnames = header
        rows: list[tuple[float, int, int]] = []
        for row in reader:
            if not any((v or "").strip() for v in row.values() if isinstance(v, str)):
                continue  # a blank line
            where = f"{path}:{reader.line_num}"
            rows.append(
                (
                    _field(row, TIMESTAMP, parse_timestamp, where),
                    _field(row, PROMPT, _count, where),
                    _field(row, OUTPUT, _count, where),
                )
            )
    rows.sort(key=lambda r: r[0])  # stable: equal times keep the file's order
    t0 = rows[0][0] if rows else 0.0
    return [Request(i, t - t0, "", p, o) for i, (t, p, o) in enumerate(rows)]


def _field(row: dict[str, str | None], column: str, parse: Callable[[str], T], where: str) -> T:
    value = row.get(column)
    if value is None or not value.strip():
        raise TraceError(f"{where}: column {column}: empty value")
    try:
        return parse(value)
    except ValueError as exc:
        raise TraceError(f"{where}: column {column}: {exc}") from None


def read_jsonl(path: Path) -> list[Request]:
    """Requests of a JSONL trace (one sim.workload.Request object a line), as written."""
    out = []
    with path.open() as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                out.append(Request(**json.loads(line)))
            except (ValueError, TypeError) as exc:
                raise TraceError(f"{path}:{line_no}: not a trace request: {exc}") from None
    return out


def read(path: Path) -> list[Request]:
    """Requests of a trace file, CSV or JSONL (see the module docstring)."""
    try:
        with path.open() as f:
            first = next((line.lstrip() for line in f if line.strip()), "")
        if not first:
            raise TraceError(f"{path}: empty trace")
        return read_jsonl(path) if first.startswith("{") else read_csv(path)
    except OSError as exc:
        raise TraceError(f"{path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise TraceError(f"{path}: not a text file ({exc.reason})") from None


def mean_rate(trace: list[Request]) -> float:
    """Requests per second: the inverse of the mean gap between arrivals (0 for fewer than two)."""
    if len(trace) < 2:
        return 0.0
    span = trace[-1].arrival_s - trace[0].arrival_s
    return (len(trace) - 1) / span if span > 0 else math.inf


def time_factor(trace: list[Request], rate: float) -> float:
    """What every arrival time is multiplied by for the trace's mean rate to become `rate` (1 when unset)."""
    source = mean_rate(trace)
    return 1.0 if rate <= 0 or source in (0.0, math.inf) else source / rate


def rescale(trace: list[Request], factor: float) -> list[Request]:
    """Every arrival time times one factor: the gaps keep their proportions, so bursts keep their shape."""
    return [replace(r, arrival_s=r.arrival_s * factor) for r in trace]


def window(trace: list[Request], duration_s: float, offset_s: float = 0.0) -> list[Request]:
    """Arrivals in [offset_s, offset_s + duration_s), moved to start at 0 (duration 0: to the end)."""
    end = offset_s + duration_s if duration_s > 0 else math.inf
    return [replace(r, arrival_s=r.arrival_s - offset_s) for r in trace if offset_s <= r.arrival_s < end]


def assign(trace: list[Request], adapters: int, zipf_s: float, tenants: int, seed: int) -> list[Request]:
    """An adapter for every request from a Zipf mix drawn from `seed`, and the tenant of that adapter."""
    if adapters < 1:
        raise ValueError("adapters must be at least 1")
    rng = random.Random(seed)
    cum = list(itertools.accumulate(zipf_weights(adapters, zipf_s)))
    out = []
    for r in trace:
        rank = min(bisect.bisect_left(cum, rng.random()), adapters - 1)
        out.append(replace(r, adapter_id=adapter_id(rank), tenant=tenant_id(rank, tenants or adapters)))
    return out


def shape(trace: list[Request], cfg: ReplayConfig) -> list[Request]:
    """The replay of a trace: offset, rescaled, windowed, adapters assigned where it has none; renumbered."""
    shifted = rescale(window(trace, 0.0, cfg.offset_s), time_factor(trace, cfg.rate))
    kept = window(shifted, cfg.duration_s)
    if any(not r.adapter_id for r in kept):
        kept = assign(kept, cfg.adapters, cfg.zipf_s, cfg.tenants, cfg.seed)
    return [replace(r, request_id=i) for i, r in enumerate(kept)]


def describe(source: list[Request], replay: list[Request], cfg: ReplayConfig) -> dict[str, object]:
    """What a replay took from its trace, for reports."""
    span = max((r.arrival_s for r in replay), default=0.0)
    return {
        "source_requests": len(source),
        "source_rate": round(mean_rate(source), 4),
        "offset_s": cfg.offset_s,
        "requests": len(replay),
        "span_s": round(span, 3),
        "rate": round(mean_rate(replay), 4),
        "tenants": len({r.tenant for r in replay if r.tenant}),
        "adapters": len({r.adapter_id for r in replay}),
    }
