"""The window keeper's bookkeeping over a plain dict standing in for the faust table."""

from __future__ import annotations

from stats_stream import tables as tb
from stats_stream.closing import WindowReport
from stats_stream.config import StatsStreamSettings
from stats_stream.keeper import WindowKeeper
from stats_stream.topics import tick
from stats_stream.windows import to_ms
from tests.stats_stream.builders import T0, request


class RebalanceDuringWrite:
    """Records each report; a rebalance lands while the write is awaited, as one may at any await."""

    def __init__(self) -> None:
        self.keeper: WindowKeeper | None = None
        self.reports: list[WindowReport] = []

    async def write(self, report: WindowReport) -> None:
        self.reports.append(report)
        assert self.keeper is not None
        self.keeper.forget_open_windows()


async def test_a_rebalance_while_a_window_is_written_still_closes_it() -> None:
    sinks = RebalanceDuringWrite()
    settings = StatsStreamSettings(window_s=1.0, grace_s=0.0, idle_close_s=60.0)
    table: dict[str, object] = {}
    keeper = WindowKeeper(table, sinks, settings)
    sinks.keeper = keeper
    start_ms = to_ms(T0)
    await keeper.handle(request(t=0.5).to_bytes(), start_ms + 500)
    await keeper.handle(request(t=1.5).to_bytes(), start_ms + 1500)  # moves event time past the first window
    await keeper.handle(tick(start_ms + 1600), start_ms + 1600)
    assert [r.window_ms for r in sinks.reports] == [start_ms]
    assert table[tb.CLOSED_THROUGH] == start_ms
    assert [tb.window_of(k) for k in table if tb.window_of(k) is not None] == [start_ms + 1000]

    await keeper.handle(request(t=2.5).to_bytes(), start_ms + 2500)  # counted against the recount
    await keeper.handle(tick(start_ms + 2600), start_ms + 2600)
    assert [r.window_ms for r in sinks.reports] == [start_ms, start_ms + 1000]
    assert [r.costs["acme"].tokens for r in sinks.reports] == [110, 110]  # one request each
