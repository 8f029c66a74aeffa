"""The window keeper's bookkeeping over a plain dict standing in for the faust table."""

from __future__ import annotations

from stats_stream import tables as tb
from stats_stream.catchup import CatchUp
from stats_stream.closing import WindowReport
from stats_stream.config import StatsStreamSettings
from stats_stream.keeper import WindowKeeper
from stats_stream.topics import tick
from stats_stream.windows import to_ms
from tests.stats_stream.builders import T0, request, state


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
    catchup = CatchUp()
    catchup.start(ends={}, starts={})  # no backlog
    keeper = WindowKeeper(table, sinks, settings, catchup)
    sinks.keeper = keeper
    start_ms = to_ms(T0)
    await keeper.handle(request(t=0.5).to_bytes(), start_ms + 500)
    await keeper.handle(request(t=1.5).to_bytes(), start_ms + 1500)  # moves event time past the first window
    await keeper.handle(tick(start_ms + 1600, catchup.token()), start_ms + 1600)
    assert [r.window_ms for r in sinks.reports] == [start_ms]
    assert table[tb.CLOSED_THROUGH] == start_ms
    assert [tb.window_of(k) for k in table if tb.window_of(k) is not None] == [start_ms + 1000]

    await keeper.handle(request(t=2.5).to_bytes(), start_ms + 2500)  # counted against the recount
    await keeper.handle(tick(start_ms + 2600, catchup.token()), start_ms + 2600)
    assert [r.window_ms for r in sinks.reports] == [start_ms, start_ms + 1000]
    assert [r.costs["acme"].tokens for r in sinks.reports] == [110, 110]  # one request each


class Reports:
    def __init__(self) -> None:
        self.reports: list[WindowReport] = []

    async def write(self, report: WindowReport) -> None:
        self.reports.append(report)


async def test_after_a_restart_a_window_waits_for_the_backlog_before_closing_on_idleness() -> None:
    sinks = Reports()
    settings = StatsStreamSettings(window_s=2.0, grace_s=0.5, idle_close_s=5.0)
    start_ms = to_ms(T0)
    before = [request(t=1.0) for _ in range(7)]
    table: dict[str, object] = {}
    old = CatchUp()
    old.start(ends={}, starts={})
    first = WindowKeeper(table, sinks, settings, old)
    for event in before:
        await first.handle(event.to_bytes(), start_ms + 1000)
    stale = tick(start_ms + 1500, old.token())  # the old process vouched for its own input only

    catchup = CatchUp()  # the restarted process: the table came back from the changelog
    keeper = WindowKeeper(table, sinks, settings, catchup)
    partition = ("requests.completed", 0)
    catchup.start(ends={partition: 15}, starts={partition: 7})  # 8 events were published while it was down
    wall = start_ms + 3000
    await keeper.handle(stale, wall)
    for _ in range(30):  # the forwarder is slow: ticks for 15 s, none vouching for the backlog
        await keeper.handle(tick(wall, catchup.token()), wall)
        wall += 500
    assert sinks.reports == []

    after = [request(t=1.0, tier="ram") for _ in range(5)]
    for offset, event in enumerate(after + before[:3], start=7):
        await keeper.handle(event.to_bytes(), wall)  # filed in order behind the stale ticks
        catchup.read(partition, offset)
    await keeper.handle(tick(wall, catchup.token()), wall)  # vouches: the idle timer starts here
    assert sinks.reports == []
    await keeper.handle(tick(wall + 5000, catchup.token()), wall + 5000)
    assert [r.window_ms for r in sinks.reports] == [start_ms]
    [stats] = sinks.reports[0].adapter_stats
    assert (stats.requests, stats.gpu_hit_rate) == (12, 7 / 12)


async def test_after_a_restart_a_later_window_read_first_does_not_close_the_backlogs_window() -> None:
    sinks = Reports()
    settings = StatsStreamSettings(window_s=2.0, grace_s=0.5, idle_close_s=5.0)
    start_ms = to_ms(T0)
    table: dict[str, object] = {tb.CLOSED_THROUGH: start_ms - 2000}  # restored from the changelog
    catchup = CatchUp()
    keeper = WindowKeeper(table, sinks, settings, catchup)
    ours, theirs = ("requests.completed", 3), ("replica.state", 5)
    catchup.start(ends={ours: 5, theirs: 1}, starts={ours: 0, theirs: 0})  # published while it was down
    wall = start_ms + 20_000
    await keeper.handle(request(t=1.0).to_bytes(), wall)  # window 0, the first of its five
    catchup.read(ours, 0)
    await keeper.handle(state(t=9.0).to_bytes(), wall)  # window 8000, from the other partition
    catchup.read(theirs, 0)
    await keeper.handle(tick(wall, catchup.token()), wall)  # event time is past window 0, its backlog is not
    assert sinks.reports == []

    for offset in range(1, 5):
        await keeper.handle(request(t=1.0, tier="ram").to_bytes(), wall)
        catchup.read(ours, offset)
    await keeper.handle(tick(wall, catchup.token()), wall)
    assert [r.window_ms for r in sinks.reports] == [start_ms]
    [stats] = sinks.reports[0].adapter_stats
    assert (stats.requests, stats.gpu_hit_rate) == (5, 1 / 5)
