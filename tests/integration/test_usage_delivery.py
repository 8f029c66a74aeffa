"""requests.completed is delivered at least once: the gateway's CompletionPublisher and its sqlite spool
against the real Kafka. Kafka unreachable when the publisher starts (its address a closed port, then a
forwarder to the real broker on that port), and a publisher killed with SIGKILL with its events spooled,
whose spool the next publisher sends. Each request's event must arrive, once after dedupe by event_id.
That the public gateway publishes through it: test_gateway_online.py and test_stream_faults.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.public.metrics import GatewayMetrics
from gateway.public.usage_events import CompletionPublisher
from harness.ports import free_port
from schemas.events import RequestCompleted, parse_event, request_completed_id
from schemas.topics import REQUESTS_COMPLETED
from tests.integration.kafka_helpers import read_to_end
from tests.integration.usage_spool_proc import usage_event
from tests.integration.waiting import wait_until

pytestmark = [pytest.mark.integration]

REPO = Path(__file__).resolve().parents[2]


@contextlib.asynccontextmanager
async def forwarding(port: int, upstream: str) -> AsyncIterator[None]:
    """Listen on loopback port and pipe each connection to upstream (host:port) until the block ends."""
    host, up_port = upstream.rsplit(":", 1)
    pipes: set[asyncio.Task] = set()

    async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        dst.close()

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(host, int(up_port))
        for task in (pipe(reader, up_writer), pipe(up_reader, writer)):
            t = asyncio.create_task(task)
            pipes.add(t)
            t.add_done_callback(pipes.discard)

    server = await asyncio.start_server(accept, "127.0.0.1", port)
    try:
        yield
    finally:
        server.close()
        for t in list(pipes):
            t.cancel()
        await asyncio.gather(*pipes, return_exceptions=True)


async def _arrived(bootstrap: str, run: str) -> list[RequestCompleted]:
    """Every requests.completed of this run on the topic, duplicates included."""

    def mine(r) -> bool:  # noqa: ANN001
        return json.loads(r.value).get("request_id", "").startswith(f"req_{run}_")

    records = await read_to_end(bootstrap, REQUESTS_COMPLETED.name, accept=mine)
    return [
        e for r in records if isinstance(e := parse_event(r.value, REQUESTS_COMPLETED.name), RequestCompleted)
    ]


def _once_each(arrived: list[RequestCompleted], run: str, count: int) -> None:
    unique = {e.event_id: e for e in arrived}  # what a consumer keeps after dedupe by event_id
    assert sorted(e.request_id for e in unique.values()) == sorted(f"req_{run}_{i}" for i in range(count))
    assert all(k == request_completed_id(e.tenant_id, e.request_id) for k, e in unique.items())
    assert sorted(e.completion_tokens for e in unique.values()) == list(range(count))


async def test_events_published_while_kafka_is_unreachable_arrive_once_it_answers(services, tmp_path) -> None:
    broker = services.settings().kafka_bootstrap
    port = free_port()
    platform = services.settings(retry_initial_s=0.2, retry_max_s=1.0).model_copy(
        update={"kafka_bootstrap": f"127.0.0.1:{port}"}
    )
    metrics = GatewayMetrics()
    sample = metrics.registry.get_sample_value
    publisher = CompletionPublisher(platform, tmp_path / "usage.sqlite", metrics)
    await publisher.start()  # Kafka unreachable: the gateway starts all the same
    run, count = uuid.uuid4().hex[:10], 60
    try:
        for i in range(count):
            publisher.publish(usage_event(run, i))
        await wait_until(lambda: _true(sample("gateway_usage_events_spooled_total") == count), "all spooled")
        await asyncio.sleep(1.5)  # several connection attempts fail meanwhile
        assert publisher.waiting() == count and sample("gateway_usage_events_sent_total") == 0

        async with forwarding(port, broker):  # Kafka answers at the publisher's address
            await wait_until(lambda: _true(publisher.waiting() == 0), "the spool to drain", 60)
        assert sample("gateway_usage_events_sent_total") == count
        assert sample("gateway_usage_spool_events") == 0
    finally:
        await publisher.stop()
    _once_each(await _arrived(broker, run), run, count)


async def test_a_killed_publishers_spool_is_sent_by_the_next_one_on_it(services, tmp_path) -> None:
    settings = services.settings()
    spool, run, count = tmp_path / "usage.sqlite", uuid.uuid4().hex[:10], 40
    closed = f"127.0.0.1:{free_port()}"
    args = [sys.executable, "-m", "tests.integration.usage_spool_proc", str(spool), closed, run, str(count)]
    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 60)  # type: ignore[union-attr]
        assert line.strip() == "spooled"
    finally:
        proc.kill()  # SIGKILL: no drain, no close
        proc.wait()

    metrics = GatewayMetrics()
    publisher = CompletionPublisher(settings, spool, metrics)
    await publisher.start()
    try:
        assert publisher.waiting() == count  # what the killed one left
        await wait_until(lambda: _true(publisher.waiting() == 0), "the left events to be sent", 60)
    finally:
        await publisher.stop()
    _once_each(await _arrived(settings.kafka_bootstrap, run), run, count)


async def _true(value: bool) -> bool:
    return value
