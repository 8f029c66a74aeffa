"""A process that spools usage events it cannot send, to be killed: `python -m tests.integration.usage_spool_proc
SPOOL BOOTSTRAP RUN COUNT` publishes COUNT events (usage_event(RUN, i)) with Kafka at BOOTSTRAP (a closed
port), prints `spooled` once all are committed to the spool at SPOOL, and waits for its SIGKILL."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from gateway.public.metrics import GatewayMetrics
from gateway.public.usage_events import CompletionPublisher
from lorafleet.config import PlatformSettings
from schemas.events import RequestCompleted, request_completed_id


def usage_event(run: str, i: int) -> RequestCompleted:
    """The i-th event of a test run: its own request id, and the event id the gateway gives that request."""
    request_id = f"req_{run}_{i}"
    return RequestCompleted(
        event_id=request_completed_id("acme", request_id),
        request_id=request_id,
        tenant_id="acme",
        alias="acme/support:prod",
        adapter_id="acme-support-v1",
        status="ok",
        completion_tokens=i,
    )


async def _main(spool: Path, bootstrap: str, run: str, count: int) -> None:
    metrics = GatewayMetrics()
    publisher = CompletionPublisher(PlatformSettings(kafka_bootstrap=bootstrap), spool, metrics)
    await publisher.start()
    for i in range(count):
        publisher.publish(usage_event(run, i))
    while metrics.registry.get_sample_value("gateway_usage_events_spooled_total") != count:
        await asyncio.sleep(0.01)
    print("spooled", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(_main(Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])))
