"""The window keeper: files each fleet-topic message into the table and closes windows that are due.

It runs inside the fleet agent's stream iteration (faust allows table writes only there). Windows close
only on a tick from the timer (every tick_s), which keeps per-event work to one small table write. A tick
arms the window clock only when it vouches that the sources' backlog is already on the fleet topic before
it; any other tick disarms it, and an unarmed clock closes no window, by event time or by idleness.

A window whose close keeps failing for another reason than the infrastructure (lorafleet.settle: data the
database refuses, a bug) is dead-lettered at the tick that closed it, with the window's events as the
value, and forgotten like a closed one, so the windows after it still close. PostgreSQL or Kafka being
down is raised instead: the window stays open and a later tick closes it, so nothing is lost in an outage.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from typing import Any

from aiokafka.errors import KafkaError
from faust.exceptions import ProducerSendError
from faust.types import TableT

from lorafleet.dead_letters import DeadLetters
from lorafleet.settle import settle
from schemas.events import Event, EventValidationError, parse_event
from stats_stream import metrics
from stats_stream import tables as tb
from stats_stream.catchup import CatchUp
from stats_stream.closing import close_window
from stats_stream.config import StatsStreamSettings
from stats_stream.signals import ScaleState
from stats_stream.sinks import Sinks
from stats_stream.topics import is_tick, tick_token
from stats_stream.windows import WindowClock, from_ms, is_late, to_ms, window_start

log = logging.getLogger(__name__)
KAFKA_DOWN = (KafkaError, ProducerSendError)  # a window's outputs could not be sent now: the infrastructure's
RecordAt = tuple[str, int, int]  # topic, partition and offset of a fleet-topic message


class WindowKeeper:
    def __init__(
        self,
        table: TableT[str, Any],
        sinks: Sinks,
        settings: StatsStreamSettings,
        catchup: CatchUp,
        letters: DeadLetters,
        backoff_s: float = 0.2,
    ) -> None:
        self.table = table
        self.letters, self.backoff_s = letters, backoff_s
        self.catchup = catchup
        self.sinks = sinks
        self.settings = settings
        self.signal_settings = settings.signals()
        self.size_ms = int(settings.window_s * 1000)
        self.clock = WindowClock(
            self.size_ms, int(settings.grace_s * 1000), int(settings.idle_close_s * 1000)
        )
        self._open: Counter[int] | None = (
            None  # events per open window; rebuilt from the table after a restart
        )

    def _get(self, key: str) -> Any:
        # faust tables raise KeyError from .get() when there is no default factory
        return self.table[key] if key in self.table else None

    def forget_open_windows(self) -> None:
        self._open = None

    def _open_windows(self) -> Counter[int]:
        """Events per open window, recounted from the table when forgotten (a rebalance may come at any
        await, even inside a window's close)."""
        if self._open is None:
            self._open = tb.open_windows(self.table)
        return self._open

    async def handle(self, raw: bytes, wall_ms: int, at: RecordAt) -> None:
        """One message from the fleet topic, read at `at`: a tick, or a source event already validated
        upstream."""
        self._start_history(wall_ms)
        open_windows = self._open_windows()
        if not is_tick(raw):
            self._file(raw, wall_ms)
            return
        if self.catchup.vouches(tick_token(raw)):
            self.clock.arm(wall_ms)
            metrics.TICKS.inc()  # the stream is live: its backlog is read
        else:
            self.clock.disarm()
        for window_ms in self.clock.due(open_windows, wall_ms):
            await self._settle(window_ms, at)
        metrics.OPEN_EVENTS.set(sum(self._open_windows().values()))

    def _start_history(self, wall_ms: int) -> None:
        # A new app id reads its topics from the beginning; only the previous window onwards is counted.
        if self._get(tb.CLOSED_THROUGH) is None:
            self.table[tb.CLOSED_THROUGH] = window_start(wall_ms, self.size_ms) - 2 * self.size_ms

    def _file(self, raw: bytes, wall_ms: int) -> None:
        try:
            event = parse_event(raw)
        except EventValidationError:
            metrics.EVENTS.labels("fleet", "invalid").inc()
            return
        topic = event.topic.name
        event_ms = to_ms(event.occurred_at)
        window_ms = window_start(event_ms, self.size_ms)
        if is_late(window_ms, self._get(tb.CLOSED_THROUGH)):
            metrics.EVENTS.labels(topic, "late").inc()
            return
        key = tb.event_key(window_ms, str(event.event_id))
        if self._get(key) is not None:
            metrics.EVENTS.labels(topic, "duplicate").inc()
            return
        self.table[key] = json.loads(raw)
        self.clock.observe(event_ms, wall_ms)
        self._open_windows()[window_ms] += 1
        metrics.EVENTS.labels(topic, "counted").inc()

    async def _settle(self, window_ms: int, at: RecordAt) -> None:
        entries = tb.window_entries(self.table, window_ms)
        subject = f"window {from_ms(window_ms).isoformat()} ({len(entries)} events in the value)"
        closed = await settle(
            lambda: self._close(window_ms, entries),
            self.letters,
            *at,
            lambda: json.dumps(list(entries.values())).encode(),  # made only for a dead letter
            backoff_s=self.backoff_s,
            transient=KAFKA_DOWN,
            subject=subject,
        )
        if not closed:
            self._forget(window_ms, entries)
            log.error("window %s dead-lettered with its %d events", window_ms, len(entries))

    def _forget(self, window_ms: int, entries: dict[str, Any]) -> None:
        for key in entries:
            del self.table[key]
        self.table[tb.CLOSED_THROUGH] = window_ms  # its late events are set aside, as a closed window's
        self._open_windows().pop(window_ms, None)

    async def _close(self, window_ms: int, entries: dict[str, Any]) -> None:
        started = time.perf_counter()
        events: list[Event] = [parse_event(v) for v in entries.values()]
        report = close_window(
            window_ms,
            events,
            ScaleState.from_json(self._get(tb.SCALE_STATE)),
            self.signal_settings,
            self.settings.fleet,
        )
        await self.sinks.write(report)  # durable before the window is forgotten
        self._forget(window_ms, entries)
        self.table[tb.SCALE_STATE] = report.scale_state.to_json()
        metrics.record(report, time.perf_counter() - started)
        log.info(
            "closed window %s: %d events, %d adapters, %d alerts, desired replicas %d",
            window_ms,
            len(events),
            len(report.adapter_stats),
            len(report.alerts),
            report.autoscale.desired_replicas,
        )
