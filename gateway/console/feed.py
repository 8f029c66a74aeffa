"""What the console's fleet view shows beside replica.state: each adapter's last adapter.stats window and the
latest alerts, followed from their topics (no group: every gateway sees all).

Both topics are read from a lookback (the last few windows, the last hour of alerts), so a console opened
after a restart shows the current picture at once. Bounded: one window per adapter, max_alerts alerts.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import deque

from aiokafka.structs import TopicPartition

from lorafleet.config import PlatformSettings
from lorafleet.dead_letters import DeadLetters
from lorafleet.kafka import make_consumer, seek_to_times
from schemas import topics
from schemas.console import AdapterWindow, AlertView
from schemas.events import AdapterStats, Alert

log = logging.getLogger(__name__)

STATS_LOOKBACK_S = 300.0
ALERTS_LOOKBACK_S = 3600.0


class ConsoleFeed:
    """adapter_id -> its newest stats window; the newest alerts first."""

    def __init__(self, max_adapters: int = 10_000, max_alerts: int = 50) -> None:
        self.max_adapters = max_adapters
        self._windows: dict[str, AdapterWindow] = {}
        self._alerts: deque[tuple[uuid.UUID, AlertView]] = deque(maxlen=max_alerts)

    def apply(self, event: AdapterStats | Alert) -> None:
        if isinstance(event, AdapterStats):
            self._apply_stats(event)
        else:
            self._apply_alert(event)

    def _apply_stats(self, event: AdapterStats) -> None:
        current = self._windows.get(event.adapter_id)
        if current is not None and current.window_start > event.window_start:
            return
        if current is None and len(self._windows) >= self.max_adapters:
            self._windows.pop(min(self._windows, key=lambda a: self._windows[a].window_start))
        self._windows[event.adapter_id] = AdapterWindow(
            adapter_id=event.adapter_id,
            window_start=event.window_start,
            requests=event.requests,
            tokens_per_s=event.tokens_per_s,
            gpu_hit_rate=event.gpu_hit_rate,
            p50_ttft_s=event.p50_ttft_s,
            p95_ttft_s=event.p95_ttft_s,
        )

    def _apply_alert(self, event: Alert) -> None:
        # a window closed twice publishes the same alert id again: show it once
        if any(event_id == event.event_id for event_id, _ in self._alerts):
            return
        self._alerts.appendleft(
            (event.event_id, AlertView(**event.model_dump(include=set(AlertView.model_fields))))
        )

    def windows(self, adapter_ids: set[str] | None = None) -> list[AdapterWindow]:
        """The newest window of each adapter (of adapter_ids when given), busiest first."""
        out = [w for a, w in self._windows.items() if adapter_ids is None or a in adapter_ids]
        return sorted(out, key=lambda w: (-w.tokens_per_s, w.adapter_id))

    def alerts(self) -> list[AlertView]:
        return [view for _, view in self._alerts]


async def consume_console_topics(
    platform: PlatformSettings, feed: ConsoleFeed, ready: asyncio.Event, letters: DeadLetters
) -> None:
    """Follow adapter.stats and alerts from their lookbacks; a record that does not decode goes to letters."""
    consumer = make_consumer(platform, group_id=None, enable_auto_commit=False)
    await consumer.start()
    try:
        lookback = {topics.ADAPTER_STATS: STATS_LOOKBACK_S, topics.ALERTS: ALERTS_LOOKBACK_S}
        parts = {TopicPartition(t.name, p): s for t, s in lookback.items() for p in range(t.partitions)}
        consumer.assign(list(parts))
        now_ms = time.time() * 1000
        await seek_to_times(consumer, {p: int(now_ms - s * 1000) for p, s in parts.items()})
        ready.set()
        async for msg in consumer:
            event = await letters.parse_following(msg.topic, msg.partition, msg.offset, msg.value)
            if isinstance(event, AdapterStats | Alert):
                feed.apply(event)
    finally:
        await consumer.stop()
