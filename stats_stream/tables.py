"""The changelog-backed table of open windows: one entry per counted event, plus two bookkeeping entries.

Keying each event by (window, event_id) makes a redelivered event overwrite itself instead of counting
twice, and makes each write small; the window's aggregates are computed once, when it closes.
A restart replays the changelog, so events counted before the restart are still there.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import faust
from faust.types import TableT

TABLE_NAME = "window-events"
CLOSED_THROUGH = "meta|closed_through"  # start (ms) of the newest closed window
SCALE_STATE = "meta|scale"  # autoscaling hysteresis carried between windows
_EVENT_PREFIX = "w|"


def declare(app: faust.App) -> TableT[str, Any]:
    return app.Table(TABLE_NAME, default=None, partitions=1, key_type=str)


def event_key(window_ms: int, event_id: str) -> str:
    return f"{_EVENT_PREFIX}{window_ms}|{event_id}"


def window_of(key: str) -> int | None:
    if not key.startswith(_EVENT_PREFIX):
        return None
    return int(key.split("|", 2)[1])


def open_windows(table: TableT[str, Any]) -> Counter[int]:
    """How many events each open window holds (a full scan; done once after start or recovery)."""
    return Counter(w for w in (window_of(k) for k in list(table.keys())) if w is not None)


def window_entries(table: TableT[str, Any], window_ms: int) -> dict[str, Any]:
    prefix = f"{_EVENT_PREFIX}{window_ms}|"
    return {k: v for k, v in list(table.items()) if k.startswith(prefix)}
