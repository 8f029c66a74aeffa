"""The local merged-replica actuator: start and drain dedicated merged replicas to follow merged.targets.

It runs beside the fleet autoscaler (the autoscale command starts both) with records of its own: pid files
`autoscale-<prefix>merged-<index>.pid` plus `.adapter` naming the adapter each one serves, and ports from
merged_first_port, so it never sees or signals the fleet's replicas, nor they its. A demotion drains the
replica through POST /internal/drain, so its running requests finish and the router, which stops choosing
it once it reports draining, sends the adapter's traffic to the unmerged owners.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time

import httpx

from lorafleet.config import PlatformSettings
from ops.autoscale.config import AutoscaleSettings
from ops.autoscale.decide import Action
from ops.autoscale.local import LocalFleet
from ops.autoscale.merged_decide import MergedObserved, MergedStart, decide_merged
from ops.autoscale.merged_targets import TargetFollower
from ops.autoscale.records import merged_records
from ops.stack.env import replica_env
from ops.stack.paths import REPO_ROOT

log = logging.getLogger(__name__)


def merged_argv(replica_id: str, port: int, adapter_id: str) -> list[str]:
    serve = ["replica", "serve", "--replica-id", replica_id, "--port", str(port)]
    return [sys.executable, "-m", "lorafleet.cli", *serve, "--merged-adapter-id", adapter_id]


class MergedFleet(LocalFleet):
    """The merged replicas this actuator started: LocalFleet's state, drain and kill, on their records."""

    targets_name, pool = "autoscaler-merged", "merged"

    def __init__(
        self, platform: PlatformSettings, settings: AutoscaleSettings, client: httpx.AsyncClient
    ) -> None:
        super().__init__(platform, settings, client)
        self.records = merged_records(platform, settings)

    def adapter_of(self, index: int) -> str | None:
        try:
            return self.records.process(index).pid_file.with_suffix(".adapter").read_text().strip() or None
        except FileNotFoundError:
            return None

    async def observe_merged(self) -> list[MergedObserved]:
        out = []
        for r in await self.observe():
            adapter_id = self.adapter_of(r.index)
            if adapter_id is not None:
                out.append(MergedObserved(adapter_id, r))
        return out

    async def apply(self, action: Action) -> None:
        if isinstance(action, MergedStart):
            self.records.touch_last_action()
            self.start_merged(action.index, action.adapter_id)
        else:
            await super().apply(action)

    def start_merged(self, index: int, adapter_id: str) -> None:
        rid, port = self.records.replica_id(index), self.records.port(index)
        proc = self.records.process(index)
        proc.run_dir.mkdir(parents=True, exist_ok=True)
        proc.pid_file.with_suffix(".adapter").write_text(adapter_id)  # before the pid file: never unnamed
        self.records.intend(index)
        pid = proc.start(
            merged_argv(rid, port, adapter_id), env=replica_env(self.database_url), cwd=REPO_ROOT
        )
        self.records.spawned(index)
        log.info("%s: merged replica of %s started on port %d (pid %d)", rid, adapter_id, port, pid)


async def run(platform: PlatformSettings, settings: AutoscaleSettings) -> None:
    """Follow merged.targets and act on it, one action at a time, until cancelled."""
    follower = TargetFollower(platform, settings.replica_id_prefix)
    following = asyncio.create_task(follower.run(), name="autoscale-merged-targets")
    limits = settings.merged_limits()
    said = ""
    try:
        async with httpx.AsyncClient() as client:
            fleet = MergedFleet(platform, settings, client)
            for index in fleet.records.adopt():  # spawned just before a crash: found by its command line
                log.warning("%s: started before a restart, adopted", fleet.records.replica_id(index))
            while not following.done():
                targets = follower.targets()
                observed = await fleet.observe_merged()
                if targets is None:
                    action, reason = None, "merged targets not read yet"
                else:
                    decision = decide_merged(observed, targets, time.time(), limits)
                    action, reason = decision.action, decision.reason
                if action is not None:
                    log.info("%s: %s", reason, action)
                    await fleet.apply(action)
                elif reason != said:
                    log.info("%s", reason)
                said = reason
                await asyncio.sleep(settings.tick_s)
            following.result()
    finally:
        following.cancel()
        await asyncio.gather(following, return_exceptions=True)
