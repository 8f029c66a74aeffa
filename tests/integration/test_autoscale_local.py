"""`autoscale --local` on the real Kafka: a signal for its fleet stops its highest replica; other fleets are ignored."""

from __future__ import annotations

import asyncio
import sys
import uuid
from pathlib import Path

from lorafleet.autoscale.config import AutoscaleSettings
from lorafleet.autoscale.local import LocalFleet, run
from lorafleet.kafka import make_producer
from schemas.events import AutoscaleSignal

# Stand-ins for replica processes: stopping is by pid file and pid, whatever the process is.
SLEEP = [sys.executable, "-c", "import time; time.sleep(120)"]


async def test_a_signal_for_our_fleet_stops_our_highest_replica_only(services, tmp_path: Path) -> None:
    platform = services.settings(data_dir=tmp_path)
    fleet_name = f"fleet-{uuid.uuid4().hex[:8]}"
    # replica-0 and -1 unmanaged, 2 to 4 in all: 3 desired stops replica-3 only, 0 desired would stop both
    settings = AutoscaleSettings(
        fleet=fleet_name,
        group_id=f"autoscale-{fleet_name}",
        min_replicas=2,
        max_replicas=4,
        unmanaged_replicas=2,
    )
    fleet = LocalFleet(platform, settings.limits())
    procs = {i: fleet.process(i) for i in (2, 3)}
    pids = {i: p.start(SLEEP) for i, p in procs.items()}
    task = asyncio.create_task(run(platform, settings))
    producer = make_producer(platform)
    await producer.start()
    try:
        for _ in range(60):  # the consumer starts at the latest offset: resend until it has joined
            for fleet_id, desired in (("someone-else", 0), (fleet_name, 3)):
                signal = AutoscaleSignal(
                    fleet=fleet_id, current_replicas=4, desired_replicas=desired, reason="test"
                )
                await producer.send_and_wait(signal.topic.name, signal.to_bytes(), key=signal.key().encode())
            await asyncio.sleep(0.5)
            if procs[3].pid() is None:
                break
        assert procs[3].pid() is None, "replica-3 was not stopped"
        assert procs[2].pid() == pids[2], "replica-2 is needed for 3 replicas and must keep running"
        assert not task.done()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await producer.stop()
        for p in procs.values():
            p.stop(timeout=2)
