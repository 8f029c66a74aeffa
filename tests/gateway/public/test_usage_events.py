"""requests.completed from the gateway's side: the event id a request gets, what the stats stream makes of
a request sent twice, and the spool's bound and shutdown with Kafka unreachable (a closed loopback port).
Delivery to a real broker: tests/integration/test_usage_delivery.py."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path
from typing import Any, cast

from gateway.config import GatewaySettings
from gateway.public.metrics import GatewayMetrics
from gateway.public.online import Online, RequestRecord
from gateway.public.usage_events import CompletionPublisher
from gateway.public.usage_spool import UsageSpool
from lorafleet.config import PlatformSettings
from schemas.events import RequestCompleted, parse_event, request_completed_id
from stats_stream.closing import close_window
from stats_stream.config import SignalSettings
from stats_stream.signals import ScaleState
from stats_stream.windows import to_ms
from tests.stats_stream.builders import request


class Published:
    """Stands in for the publisher: keeps what Online.finish hands it."""

    def __init__(self) -> None:
        self.events: list[RequestCompleted] = []

    def publish(self, event: RequestCompleted) -> None:
        self.events.append(event)


def _online(published: Published) -> Online:
    return Online(GatewaySettings(), *([cast(Any, None)] * 4), cast(Any, published), GatewayMetrics())


async def _finish(online: Online, request_id: str, tenant: str = "acme") -> None:
    rec = RequestRecord(request_id=request_id, tenant_id=tenant, started=time.perf_counter())
    rec.alias, rec.adapter_id, rec.replica_id, rec.tier = f"{tenant}/support:prod", "a1", None, "gpu"
    await online.finish(rec, "ok", None)


async def test_a_requests_event_id_is_a_function_of_its_tenant_and_request_id() -> None:
    published = Published()
    online = _online(published)
    for request_id, tenant in [("req_1", "acme"), ("req_1", "acme"), ("req_2", "acme"), ("req_1", "beta")]:
        await _finish(online, request_id, tenant)
    first, again, other, elsewhere = (e.event_id for e in published.events)
    assert first == again == request_completed_id("acme", "req_1")
    assert len({first, other, elsewhere}) == 3


async def test_a_request_resent_or_built_twice_is_counted_once_by_the_stats_stream() -> None:
    published = Published()
    online = _online(published)
    await _finish(online, "req_1")
    await _finish(online, "req_1")  # the same request's event built again
    built, rebuilt = published.events
    resent = parse_event(built.to_bytes())  # the spool sends the committed bytes again after a crash
    settings = SignalSettings(window_s=60)
    report = close_window(
        to_ms(built.occurred_at), [built, resent, rebuilt, request("a1", t=1.0)], ScaleState(), settings
    )
    (stats,) = report.adapter_stats
    assert stats.requests == 2  # req_1 once, and the other request


def _closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


async def _until(pred: Any, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def test_with_kafka_down_the_spool_keeps_events_up_to_its_bound_through_a_stop(tmp_path: Path) -> None:
    platform = PlatformSettings(kafka_bootstrap=_closed_port(), retry_initial_s=0.05, retry_max_s=0.2)
    metrics = GatewayMetrics()
    sample = metrics.registry.get_sample_value
    path = tmp_path / "usage.sqlite"
    publisher = CompletionPublisher(platform, path, metrics, max_events=3, drain_timeout_s=0.2)
    await publisher.start()
    events = [request(t=float(i)) for i in range(5)]
    for event in events:
        publisher.publish(event)  # returns at once: nothing here waits on the disk or on Kafka
    await _until(lambda: sample("gateway_usage_events_spooled_total") == 3, "3 events spooled")
    await _until(
        lambda: sample("gateway_usage_events_dropped_total", {"reason": "spool_full"}) == 2, "2 drops"
    )
    assert sample("gateway_usage_spool_events") == 3 and sample("gateway_usage_events_sent_total") == 0
    await publisher.stop()  # Kafka never answered: the drain gives up and the events stay

    spool = UsageSpool.open(path, max_events=3)
    kept = [parse_event(s.record.value) for s in spool.oldest(10)]
    spool.close()
    assert [e.event_id for e in kept] == [e.event_id for e in events[:3]]  # the oldest, in order
