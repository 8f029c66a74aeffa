"""The control loop's supervisor keeps a replica serving while Kafka is down and stops when asked."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

from lorafleet.config import PlatformSettings
from replica.adapter_cache.tier import CacheEvent
from replica.control.state_publisher import Load, build_state
from replica.control.supervisor import supervise_control
from tests.replica.adapter_cache.helpers import make_env


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens here once the socket closes


async def test_kafka_down_is_retried_without_ending_and_shutdown_stops_it(tmp_path: Path) -> None:
    env = make_env(tmp_path)
    platform = PlatformSettings(kafka_bootstrap=f"127.0.0.1:{_closed_port()}")
    shutdown = asyncio.Event()

    def make_state():  # noqa: ANN202
        return build_state("r1", "http://127.0.0.1:1", "ready", env.cache, 4, Load(0, 0))

    task = asyncio.create_task(
        supervise_control(platform, "r1", env.cache, make_state, shutdown, 0.1, retry_s=0.05)
    )
    await asyncio.sleep(0.5)  # several failed attempts
    assert not task.done(), "a broker that is down must not end the control loop for good"
    # loads and evictions go to replica.events and still reach the sink the cache had (the metrics)
    event = CacheEvent("load", "a", "disk", "ram", 0.1, 10)
    env.cache.on_event(event)
    assert env.events[-1] == event
    shutdown.set()
    await asyncio.wait_for(task, 5)
