"""requests.completed: one event per request, delivered to Kafka at least once through a local spool.

publish() never raises and never waits on disk or Kafka: it queues the event in memory, and a writer task
commits the queue to a sqlite spool (gateway/public/usage_spool.py, which says why sqlite and not a
PostgreSQL outbox) on a worker thread, one transaction per batch. A drainer task sends the spool's oldest
events in order with the idempotent producer (acks=all) and deletes them only once the broker acknowledged
them. While Kafka is down, at the gateway's start too, the drainer starts over with backoff
(lorafleet.retry) and the spool fills; once Kafka answers it sends everything spooled meanwhile, and a
gateway that restarts sends what its previous run left. An event resent after a crash between the
acknowledgement and the delete keeps its event_id, a function of the request
(schemas.events.request_completed_id), and every consumer dedupes on it.

Bounds: the spool holds at most max_events and the memory queue QUEUE_MAX; past either the newest events
are dropped, logged and counted (gateway_usage_events_dropped_total). stop() commits the queue and sends
for up to drain_timeout_s; what is left waits in the spool for the next start. A process killed between
publish() and the commit, a few milliseconds, loses those events; a spool that can't be opened (another
live gateway holds it, or the folder is not writable) stops the gateway at its start.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from aiokafka import AIOKafkaProducer

from gateway.public.metrics import GatewayMetrics
from gateway.public.usage_spool import Record, Spooled, UsageSpool
from lorafleet.config import PlatformSettings
from lorafleet.kafka import make_producer
from lorafleet.retry import run_with_retry
from schemas.events import RequestCompleted

log = logging.getLogger(__name__)

T = TypeVar("T")

QUEUE_MAX = 10_000  # events waiting for the spool's writer: more means the disk has stopped answering
SEND_BATCH = 500  # events read from the spool and sent before their deletes are committed
IDLE_POLL_S = 1.0  # an idle drainer looks at the spool at least this often


class CompletionPublisher:
    """Owns the spool, its writer and its drainer; publish() never raises."""

    def __init__(
        self,
        platform: PlatformSettings,
        spool_path: Path,
        metrics: GatewayMetrics,
        max_events: int = 1_000_000,
        drain_timeout_s: float = 5.0,
    ) -> None:
        self.platform = platform
        self.spool_path = spool_path
        self.metrics = metrics
        self.max_events = max_events
        self.drain_timeout_s = drain_timeout_s
        self._queue: list[Record] = []
        self._queued = asyncio.Event()  # the writer has events to commit
        self._spooled = asyncio.Event()  # the drainer has events to send
        self._stop = asyncio.Event()
        self._closing = False
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="usage-spool")
        self._spool: UsageSpool | None = None
        self._writer: asyncio.Task | None = None
        self._drainer: asyncio.Task | None = None

    async def start(self) -> None:
        """Open the spool (what a previous run left included) and start the writer and the drainer."""
        spool = await self._on_thread(UsageSpool.open, self.spool_path, self.max_events)
        self._spool = spool
        self.metrics.usage_waiting.set(spool.count())
        if spool.count():
            log.info("requests.completed: %d events left in the spool by a previous run", spool.count())
        self._writer = asyncio.create_task(self._write_loop(), name="usage-spool-writer")
        self._drainer = asyncio.create_task(
            run_with_retry("requests.completed drainer", self._drain, self._stop, self.platform),
            name="usage-spool-drainer",
        )

    def publish(self, event: RequestCompleted) -> None:
        """Queue the event for the spool; past QUEUE_MAX it is dropped and counted."""
        if self._closing or len(self._queue) >= QUEUE_MAX:
            self._dropped("spool_error", 1)
            return
        self._queue.append(Record(event.topic.name, event.key().encode(), event.to_bytes()))
        self._queued.set()

    def waiting(self) -> int:
        """Events in the spool, not yet acknowledged by Kafka."""
        return self._spool.count() if self._spool is not None else 0

    async def stop(self) -> None:
        """Commit the queue, send for up to drain_timeout_s, and close; the rest stays in the spool."""
        if self._writer is None or self._drainer is None or self._spool is None:
            return
        self._closing = True
        self._queued.set()
        await self._writer
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._sent_all(), self.drain_timeout_s)
        self._stop.set()
        self._drainer.cancel()
        await asyncio.gather(self._drainer, return_exceptions=True)
        if self._spool.count():
            log.warning("requests.completed: %d events stay in the spool for the next start", self.waiting())
        await self._on_thread(self._spool.close)
        self._thread.shutdown(wait=False)

    async def _sent_all(self) -> None:
        while self.waiting():
            await asyncio.sleep(0.05)

    async def _write_loop(self) -> None:
        while True:
            await self._queued.wait()
            self._queued.clear()
            await self._commit_queue()
            if self._closing:
                return

    async def _commit_queue(self) -> None:
        records, self._queue = self._queue, []
        if not records or self._spool is None:
            return
        try:
            done = await self._on_thread(self._spool.append, records)
        except Exception as exc:  # noqa: BLE001 - a full or failing disk must not fail requests
            log.error("requests.completed: %d events not spooled: %s", len(records), exc)
            self._dropped("spool_error", len(records))
            return
        if done.kept:
            self.metrics.usage_spooled.inc(done.kept)
            self._spooled.set()
        if done.dropped:
            log.error("requests.completed: spool full (%d), %d events dropped", self.max_events, done.dropped)
            self._dropped("spool_full", done.dropped)
        self.metrics.usage_waiting.set(self._spool.count())

    def _dropped(self, reason: str, n: int) -> None:
        self.metrics.usage_dropped.labels(reason).inc(n)

    async def _drain(self, stop: asyncio.Event) -> None:
        """Send the spool's oldest events until stop; any failure is raised for run_with_retry's backoff."""
        assert self._spool is not None
        producer = make_producer(self.platform)
        try:
            await producer.start()
            log.info("requests.completed: producer connected, %d events waiting", self._spool.count())
            while not stop.is_set():
                self._spooled.clear()
                batch = await self._on_thread(self._spool.oldest, SEND_BATCH)
                if batch:
                    await self._send(producer, batch)
                    continue
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._spooled.wait(), IDLE_POLL_S)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(producer.stop(), 5.0)

    async def _send(self, producer: AIOKafkaProducer, batch: list[Spooled]) -> None:
        """Send batch in order; delete what was acknowledged, then raise the first failure if any."""
        assert self._spool is not None
        futures: list[asyncio.Future] = []
        error: BaseException | None = None
        for s in batch:
            try:
                futures.append(await producer.send(s.record.topic, s.record.value, key=s.record.key))
            except Exception as exc:  # noqa: BLE001 - raised below, after the acknowledged are deleted
                error = exc
                break
        results = await asyncio.gather(*futures, return_exceptions=True)
        acked = [s.seq for s, r in zip(batch, results, strict=False) if not isinstance(r, BaseException)]
        await self._on_thread(self._spool.delete, acked)
        self.metrics.usage_sent.inc(len(acked))
        self.metrics.usage_waiting.set(self._spool.count())
        error = error or next((r for r in results if isinstance(r, BaseException)), None)
        if error is not None:
            raise error

    async def _on_thread(self, fn: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, functools.partial(fn, *args))
