"""The local actuator: consume autoscale.signals and start or stop replica processes by pid file.

Our replicas' pid files are named `autoscale-replica-k`, so the autoscaler recognises the processes it started
(across its own restarts) and can never stop one it did not. A new replica loads the base model, publishes
replica.state and receives its owned adapters from the placement worker, which warms them.
"""

from __future__ import annotations

import logging
import os
import sys

from lorafleet.autoscale.config import AutoscaleSettings
from lorafleet.autoscale.decide import Limits, Start, Stop, decide
from lorafleet.config import PlatformSettings
from lorafleet.kafka import make_consumer
from lorafleet.services.paths import REPO_ROOT, log_dir, run_dir
from lorafleet.services.process import ManagedProcess
from lorafleet.services.stack import FLEET_ENV
from schemas import topics
from schemas.events import AutoscaleSignal, parse_event

log = logging.getLogger(__name__)


def replica_argv(start: Start) -> list[str]:
    """The same command line as the stack's replica-0 and replica-1, with the next id and port."""
    serve = ["replica", "serve", "--replica-id", start.replica_id, "--port", str(start.port)]
    return [sys.executable, "-m", "lorafleet.cli", *serve]


class LocalFleet:
    """The replica processes this autoscaler started, found by their pid files."""

    def __init__(self, platform: PlatformSettings, limits: Limits) -> None:
        self.platform, self.limits = platform, limits

    def process(self, index: int) -> ManagedProcess:
        return ManagedProcess(f"autoscale-replica-{index}", run_dir(self.platform), log_dir(self.platform))

    def managed(self) -> dict[int, int]:
        """index -> pid of our live replicas (an upper bound of indices we could have used)."""
        out: dict[int, int] = {}
        for i in range(self.limits.unmanaged_replicas, self.limits.max_replicas + 8):
            pid = self.process(i).pid()
            if pid is not None:
                out[i] = pid
        return out

    def apply(self, action: Start | Stop) -> None:
        proc = self.process(action.index)
        if isinstance(action, Start):
            env = {k: v for k, v in FLEET_ENV.items() if k not in os.environ}
            pid = proc.start(replica_argv(action), env=env, cwd=REPO_ROOT)
            log.info(
                "started %s on port %d (pid %d, log %s)", action.replica_id, action.port, pid, proc.log_file
            )
        elif proc.pid() == action.pid:  # still the process we started
            proc.stop()
            log.info("stopped %s (pid %d)", action.replica_id, action.pid)

    def act_on(self, signal: AutoscaleSignal) -> list[Start | Stop]:
        actions = decide(self.managed(), signal.desired_replicas, self.limits)
        for a in actions:
            self.apply(a)
        return actions


async def run(platform: PlatformSettings, settings: AutoscaleSettings) -> None:
    """Act on every signal of our fleet until cancelled; old signals are skipped (latest offsets only)."""
    fleet = LocalFleet(platform, settings.limits())
    consumer = make_consumer(
        platform, topics.AUTOSCALE_SIGNALS.name, group_id=settings.group_id, auto_offset_reset="latest"
    )
    await consumer.start()
    try:
        async for record in consumer:
            event = parse_event(record.value, record.topic)
            if isinstance(event, AutoscaleSignal) and event.fleet == settings.fleet:
                actions = fleet.act_on(event)
                log.info(
                    "signal desired=%d (%s): %s", event.desired_replicas, event.reason, actions or "no change"
                )
            await consumer.commit()
    finally:
        await consumer.stop()
