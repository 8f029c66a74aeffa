"""The local actuator: observe our replicas, ask decide() for the next action, carry it out. I/O only.

Our replicas are found by their pid files (records.py), so the autoscaler recognises the processes it
started across its own restarts and never signals one it did not. A replica's status comes from its state
route. A scale-down asks the replica to drain (POST /internal/drain) and waits for its process to exit.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import sys
import time

import httpx

from lorafleet.config import PlatformSettings
from ops.autoscale.config import AutoscaleSettings
from ops.autoscale.decide import Action, Drain, Kill, Observed, Start, decide
from ops.autoscale.records import Record, Records
from ops.autoscale.signals import SignalFollower
from ops.stack import prometheus
from ops.stack.env import replica_env
from ops.stack.paths import REPO_ROOT
from ops.stack.scrape import ReplicaTarget, write_replica_targets
from schemas.events import ReplicaStatus
from schemas.replica_api import DrainRequest, DrainResponse, StateResponse

log = logging.getLogger(__name__)

# The line the autoscaler logs for each replica it starts (benchmarks and tests count starts by it).
STARTED = re.compile(r": started for (?:load|thrashing) on port \d+")


def replica_argv(replica_id: str, port: int) -> list[str]:
    """The same command line as the stack's replica-0 and replica-1, with the next id and port."""
    serve = ["replica", "serve", "--replica-id", replica_id, "--port", str(port)]
    return [sys.executable, "-m", "lorafleet.cli", *serve]


class LocalFleet:
    """The replica processes this autoscaler started, and the HTTP calls it makes to them."""

    targets_name, pool = "autoscaler", "default"  # its Prometheus file_sd file and the replicas' pool

    def __init__(
        self, platform: PlatformSettings, settings: AutoscaleSettings, client: httpx.AsyncClient
    ) -> None:
        self.settings, self.client = settings, client
        self.database_url = platform.database_url  # its replicas register where it reads
        self.targets_dir = prometheus.targets_dir(platform)
        self.records = Records(platform, settings.replica_id_prefix, settings.first_port)
        self.headers = {"Authorization": f"Bearer {settings.replica_service_token.get_secret_value()}"}

    def url(self, index: int) -> str:
        return f"http://{self.settings.host}:{self.records.port(index)}"

    async def status(self, r: Record) -> ReplicaStatus | None:
        try:
            resp = await self.client.get(
                f"{self.url(r.index)}/internal/replicas/{r.replica_id}/state",
                headers=self.headers,
                timeout=2.0,
            )
            resp.raise_for_status()
            return StateResponse.model_validate_json(resp.content).status
        except (httpx.HTTPError, ValueError):
            return None

    async def observe(self) -> list[Observed]:
        """Our live replicas; records what completed since the last look (an exit, a first ready)."""
        for index in self.records.reap():
            log.info("%s: process gone", self.records.replica_id(index))
            self.records.touch_last_action()
        records = self.records.live()
        write_replica_targets(
            self.targets_dir,
            self.targets_name,
            [ReplicaTarget(r.replica_id, self.settings.host, r.port, self.pool) for r in records],
        )
        statuses = await asyncio.gather(*(self.status(r) for r in records))
        out = []
        for r, status in zip(records, statuses, strict=True):
            was_ready = r.was_ready
            if status == "ready" and not was_ready and r.drain_deadline is None:
                self.records.mark_ready(r.index)
                self.records.touch_last_action()
                log.info("%s: ready %.1fs after its start", r.replica_id, time.time() - r.started_at)
                was_ready = True
            out.append(
                Observed(r.index, r.pid, r.started_at, status, was_ready, r.drain_deadline, r.for_thrashing)
            )
        return out

    async def apply(self, action: Action) -> None:
        self.records.touch_last_action()
        if isinstance(action, Start):
            await self.start(action.index, action.for_thrashing)
        elif isinstance(action, Drain):
            await self.drain(action)
        else:
            self.kill(action)

    async def start(self, index: int, for_thrashing: bool = False) -> None:
        rid, port = self.records.replica_id(index), self.records.port(index)
        proc = self.records.process(index)
        self.records.intend(index, for_thrashing)
        pid = proc.start(replica_argv(rid, port), env=replica_env(self.database_url), cwd=REPO_ROOT)
        self.records.spawned(index)
        why = "for thrashing" if for_thrashing else "for load"
        log.info("%s: started %s on port %d (pid %d, log %s)", rid, why, port, pid, proc.log_file)

    async def drain(self, action: Drain) -> None:
        rid = self.records.replica_id(action.index)
        body = DrainRequest(deadline_s=self.settings.drain_deadline_s)
        try:
            resp = await self.client.post(
                f"{self.url(action.index)}/internal/drain",
                content=body.model_dump_json(),
                headers={**self.headers, "content-type": "application/json"},
                timeout=5.0,
            )
            resp.raise_for_status()
            answer = DrainResponse.model_validate_json(resp.content)
        except (httpx.HTTPError, ValueError) as exc:
            # SIGTERM drains the same way; the deadline is ours
            log.warning("%s: drain route failed (%s); sending SIGTERM", rid, exc)
            if self.records.process(action.index).pid() == action.pid:
                os.kill(action.pid, signal.SIGTERM)
            self.records.mark_draining(action.index, time.time() + self.settings.drain_deadline_s)
            return
        self.records.mark_draining(action.index, time.time() + answer.deadline_s)
        log.info("%s: draining, %d in flight, deadline %.0fs", rid, answer.in_flight, answer.deadline_s)

    def kill(self, action: Kill) -> None:
        rid, proc = self.records.replica_id(action.index), self.records.process(action.index)
        if proc.pid() != action.pid:
            return
        log.error("%s: %s; killing pid %d", rid, action.reason, action.pid)
        os.kill(action.pid, signal.SIGKILL)
        self.records.forget(action.index)


async def run(platform: PlatformSettings, settings: AutoscaleSettings) -> None:
    """Follow the fleet's signal and act on it, one action at a time, until cancelled."""
    follower = SignalFollower(platform, settings.fleet, settings.signal_max_age_s)
    following = asyncio.create_task(follower.run(), name="autoscale-signals")
    limits = settings.limits()
    said = ""
    try:
        async with httpx.AsyncClient() as client:
            fleet = LocalFleet(platform, settings, client)
            for index in fleet.records.adopt():
                log.warning(
                    "%s: started before a restart, adopted by its command line",
                    fleet.records.replica_id(index),
                )
            while not following.done():
                observed = await fleet.observe()
                now = time.time()
                decision = decide(observed, follower.demand(now), now, fleet.records.last_action_at(), limits)
                if decision.action is not None:
                    log.info("%s: %s", decision.reason, decision.action)
                    await fleet.apply(decision.action)
                elif decision.reason != said:
                    log.info("%s", decision.reason)
                said = decision.reason
                await asyncio.sleep(settings.tick_s)
            following.result()
    finally:
        following.cancel()
        await asyncio.gather(following, return_exceptions=True)
