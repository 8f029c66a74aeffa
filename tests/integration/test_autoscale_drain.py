"""A scale-down signal makes the autoscaler drain its own replica through POST /internal/drain: the replica
reports `draining`, its process exits, and the replica it did not start keeps running.

The stats stream first asks for two replicas (a signal floor of two), then is restarted with a floor of one
and a one-window hysteresis, so its next signal asks for one.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace
from pathlib import Path

import pytest

from bench.scaleup import Recorded, record
from harness.stacks.scaleup import ScaleupConfig, scaleup_stack, wait_for
from schemas.events import ReplicaState

pytestmark = [pytest.mark.integration, pytest.mark.slow]


async def test_a_scale_down_drains_our_replica_through_the_route_and_waits_for_its_exit(
    services, tmp_path: Path
) -> None:
    cfg = ScaleupConfig(gateway=False, stats_min_replicas=2, max_replicas=2, cooldown_s=0.0)
    async with scaleup_stack(services.settings(), tmp_path, cfg) as stack:
        recs = stack.records()
        rec, listening = Recorded(), asyncio.Event()
        recorder = asyncio.create_task(record(services.settings(), stack, rec, listening))
        try:
            await asyncio.wait_for(listening.wait(), 30)
            autoscaler = stack.autoscaler()
            autoscaler.start()

            async def ours_ready() -> bool:
                live = recs.live()
                return len(live) == 1 and live[0].was_ready

            await wait_for(ours_ready, 120, "replica 1 started and ready", stack)
            [ours] = recs.live()
            replica0 = stack.procs["replica-0"]

            stream = stack.procs["stats-stream"]
            stream.stop()
            env = {
                **stream.spec.env,
                "LORAFLEET_STATS_MIN_REPLICAS": "1",
                "LORAFLEET_STATS_SCALE_DOWN_WINDOWS": "1",
            }
            stack.add(replace(stream.spec, env=env, log="stats-stream-2")).start()

            await wait_for(lambda: recs.live() == [], 120, "replica 1 drained and gone", stack)
            log = autoscaler.log.read_text()
            assert "draining, " in log and "drain route failed" not in log, autoscaler.tail()
            assert "killing" not in log, autoscaler.tail()  # it exited on its own, within the deadline
            statuses = [s.status for _, s in rec.of(ReplicaState) if s.replica_id == stack.replica_id(1)]
            assert "draining" in statuses, statuses
            assert ours.pid not in stack.replica_processes()
            assert replica0.alive and len(stack.replica_processes()) == 1
            assert autoscaler.alive, autoscaler.tail()
        finally:
            recorder.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await recorder
