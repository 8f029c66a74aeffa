"""The window keeper's bookkeeping over a plain dict standing in for the faust table: windows close, and one
whose close keeps failing is dead-lettered while one that meets an outage stays open."""

from __future__ import annotations

import json

import asyncpg
import pytest
from aiokafka.errors import KafkaTimeoutError
from faust.exceptions import ProducerSendError

from stats_stream import tables as tb
from stats_stream.catchup import CatchUp
from stats_stream.closing import WindowReport
from stats_stream.config import StatsStreamSettings
from stats_stream.keeper import WindowKeeper
from stats_stream.topics import tick
from stats_stream.windows import to_ms
from tests.stats_stream.builders import T0, request, state

AT = ("stats-fleet", 0, 41)  # where each fleet-topic message is read, for a dead letter


class Letters:
    consumer = "stats-stream"

    def __init__(self) -> None:
        self.recorded: list[tuple[str, int, int, bytes | None, str]] = []

    async def record(self, topic: str, partition: int, offset: int, value: bytes | None, reason: str) -> None:
        self.recorded.append((topic, partition, offset, value, reason))


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
    keeper = WindowKeeper(table, sinks, settings, catchup, Letters())
    sinks.keeper = keeper
    start_ms = to_ms(T0)
    await keeper.handle(request(t=0.5).to_bytes(), start_ms + 500, AT)
    await keeper.handle(
        request(t=1.5).to_bytes(), start_ms + 1500, AT
    )  # moves event time past the first window
    await keeper.handle(tick(start_ms + 1600, catchup.token()), start_ms + 1600, AT)
    assert [r.window_ms for r in sinks.reports] == [start_ms]
    assert table[tb.CLOSED_THROUGH] == start_ms
    assert [tb.window_of(k) for k in table if tb.window_of(k) is not None] == [start_ms + 1000]

    await keeper.handle(request(t=2.5).to_bytes(), start_ms + 2500, AT)  # counted against the recount
    await keeper.handle(tick(start_ms + 2600, catchup.token()), start_ms + 2600, AT)
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
    first = WindowKeeper(table, sinks, settings, old, Letters())
    for event in before:
        await first.handle(event.to_bytes(), start_ms + 1000, AT)
    stale = tick(start_ms + 1500, old.token())  # the old process vouched for its own input only

    catchup = CatchUp()  # the restarted process: the table came back from the changelog
    keeper = WindowKeeper(table, sinks, settings, catchup, Letters())
    partition = ("requests.completed", 0)
    catchup.start(ends={partition: 15}, starts={partition: 7})  # 8 events were published while it was down
    wall = start_ms + 3000
    await keeper.handle(stale, wall, AT)
    for _ in range(30):  # the forwarder is slow: ticks for 15 s, none vouching for the backlog
        await keeper.handle(tick(wall, catchup.token()), wall, AT)
        wall += 500
    assert sinks.reports == []

    after = [request(t=1.0, tier="ram") for _ in range(5)]
    for offset, event in enumerate(after + before[:3], start=7):
        await keeper.handle(event.to_bytes(), wall, AT)  # filed in order behind the stale ticks
        catchup.read(partition, offset)
    await keeper.handle(tick(wall, catchup.token()), wall, AT)  # vouches: the idle timer starts here
    assert sinks.reports == []
    await keeper.handle(tick(wall + 5000, catchup.token()), wall + 5000, AT)
    assert [r.window_ms for r in sinks.reports] == [start_ms]
    [stats] = sinks.reports[0].adapter_stats
    assert (stats.requests, stats.gpu_hit_rate) == (12, 7 / 12)


async def test_after_a_restart_a_later_window_read_first_does_not_close_the_backlogs_window() -> None:
    sinks = Reports()
    settings = StatsStreamSettings(window_s=2.0, grace_s=0.5, idle_close_s=5.0)
    start_ms = to_ms(T0)
    table: dict[str, object] = {tb.CLOSED_THROUGH: start_ms - 2000}  # restored from the changelog
    catchup = CatchUp()
    keeper = WindowKeeper(table, sinks, settings, catchup, Letters())
    ours, theirs = ("requests.completed", 3), ("replica.state", 5)
    catchup.start(ends={ours: 5, theirs: 1}, starts={ours: 0, theirs: 0})  # published while it was down
    wall = start_ms + 20_000
    await keeper.handle(request(t=1.0).to_bytes(), wall, AT)  # window 0, the first of its five
    catchup.read(ours, 0)
    await keeper.handle(state(t=9.0).to_bytes(), wall, AT)  # window 8000, from the other partition
    catchup.read(theirs, 0)
    await keeper.handle(
        tick(wall, catchup.token()), wall, AT
    )  # event time is past window 0, its backlog is not
    assert sinks.reports == []

    for offset in range(1, 5):
        await keeper.handle(request(t=1.0, tier="ram").to_bytes(), wall, AT)
        catchup.read(ours, offset)
    await keeper.handle(tick(wall, catchup.token()), wall, AT)
    assert [r.window_ms for r in sinks.reports] == [start_ms]
    [stats] = sinks.reports[0].adapter_stats
    assert (stats.requests, stats.gpu_hit_rate) == (5, 1 / 5)


class RefusingSinks:
    """The database refuses a window holding the refused adapter (a data error); `down` fails every write."""

    def __init__(self, refused: str, down: Exception | None = None) -> None:
        self.refused, self.down = refused, down
        self.reports: list[WindowReport] = []
        self.tries = 0

    async def write(self, report: WindowReport) -> None:
        self.tries += 1
        if self.down is not None:
            raise self.down
        if any(s.adapter_id == self.refused for s in report.adapter_stats):
            raise asyncpg.exceptions.InvalidParameterValueError("injected fault")
        self.reports.append(report)


def _live_keeper(sinks: RefusingSinks, letters: Letters) -> tuple[WindowKeeper, dict[str, object], CatchUp]:
    settings = StatsStreamSettings(window_s=1.0, grace_s=0.0, idle_close_s=60.0)
    table: dict[str, object] = {}
    catchup = CatchUp()
    catchup.start(ends={}, starts={})  # no backlog
    return WindowKeeper(table, sinks, settings, catchup, letters, backoff_s=0), table, catchup


async def test_a_window_the_database_keeps_refusing_is_dead_lettered_with_its_events_and_the_next_closes() -> (
    None
):
    sinks, letters = RefusingSinks("poison"), Letters()
    keeper, table, catchup = _live_keeper(sinks, letters)
    start_ms = to_ms(T0)
    await keeper.handle(request("poison", t=0.5).to_bytes(), start_ms + 500, AT)
    await keeper.handle(request("fine", t=1.5).to_bytes(), start_ms + 1500, AT)
    closing = ("stats-fleet", 0, 42)
    await keeper.handle(tick(start_ms + 1600, catchup.token()), start_ms + 1600, closing)
    ((topic, partition, offset, value, reason),) = letters.recorded
    assert (topic, partition, offset) == closing and sinks.tries == 3
    assert reason.startswith("window 2026-01-01T12:00:00+00:00 (1 events in the value): "), reason
    assert reason.endswith("the handler failed 3 times: InvalidParameterValueError: injected fault"), reason
    assert value is not None and [e["adapter_id"] for e in json.loads(value)] == ["poison"]
    assert table[tb.CLOSED_THROUGH] == start_ms and tb.SCALE_STATE not in table  # forgotten, no signal state
    assert [tb.window_of(k) for k in table if tb.window_of(k) is not None] == [start_ms + 1000]

    await keeper.handle(request("fine", t=2.5).to_bytes(), start_ms + 2500, AT)
    await keeper.handle(tick(start_ms + 2600, catchup.token()), start_ms + 2600, AT)
    assert [r.window_ms for r in sinks.reports] == [start_ms + 1000] and len(letters.recorded) == 1


@pytest.mark.parametrize(
    "outage",
    [
        ConnectionRefusedError("PostgreSQL is down"),
        ProducerSendError("Error while sending: KafkaConnectionError()"),
        KafkaTimeoutError(),
    ],
    ids=type,
)
async def test_a_window_that_cannot_be_written_in_an_outage_stays_open_and_a_later_tick_closes_it(
    outage: Exception,
) -> None:
    sinks, letters = RefusingSinks("poison", down=outage), Letters()
    keeper, table, catchup = _live_keeper(sinks, letters)
    start_ms = to_ms(T0)
    await keeper.handle(request(t=0.5).to_bytes(), start_ms + 500, AT)
    await keeper.handle(request(t=1.5).to_bytes(), start_ms + 1500, AT)
    with pytest.raises(type(outage)):
        await keeper.handle(tick(start_ms + 1600, catchup.token()), start_ms + 1600, AT)
    assert sinks.tries == 1 and letters.recorded == [] and table[tb.CLOSED_THROUGH] == start_ms - 2000
    sinks.down = None
    await keeper.handle(tick(start_ms + 1700, catchup.token()), start_ms + 1700, AT)
    assert [r.window_ms for r in sinks.reports] == [start_ms] and letters.recorded == []
