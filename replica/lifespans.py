"""What runs beside the replica's HTTP server, one lifespan per serving mode, chosen by lifespan_for.

Every mode starts the replica (engine thread, adapter cache or merge clients) before serving and stops it
after; at shutdown each background task ends on the shutdown event, and a drain still running is cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from fastapi import FastAPI

from lorafleet.state_signature import state_key
from replica.config import ReplicaSettings
from replica.control.drain import Drain
from replica.control.identity import identity_key
from replica.control.merged_mode import merge_until_done, publish_forever
from replica.control.registration import register_until_done
from replica.control.supervisor import supervise_control
from replica.control.warming import warm_up
from replica.runtime import Replica

Mode = Literal["standalone", "controlled", "merged"]
Lifespan = Callable[[FastAPI], AbstractAsyncContextManager[None]]


def serving_mode(settings: ReplicaSettings) -> Mode:
    """merged: one adapter folded into the weights; controlled: an adapter cache run by the control plane
    (Kafka commands, placements); standalone: an adapter cache and no control plane."""
    if settings.merged_adapter_id is not None:
        return "merged"
    return "controlled" if settings.control_enabled else "standalone"


@dataclass
class Background:
    """The tasks that run beside the server until `shutdown` is set."""

    shutdown: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    cancelled: list[asyncio.Task[None]] = field(default_factory=list)  # cancelled at shutdown as well

    def run(self, work: Coroutine[Any, Any, None], name: str, cancel: bool = False) -> None:
        task = asyncio.create_task(work, name=name)
        self.tasks.append(task)
        if cancel:
            self.cancelled.append(task)


@asynccontextmanager
async def _serving(app: FastAPI) -> AsyncIterator[Background]:
    """Start the replica; at exit, end the background tasks, close the placements table and stop it."""
    replica: Replica = app.state.replica
    drain: Drain = app.state.drain
    await replica.start()
    background = Background()
    try:
        yield background
    finally:
        background.shutdown.set()
        for task in (*background.cancelled, drain.task):
            if task is not None and not task.done():
                task.cancel()
        await asyncio.gather(*background.tasks, return_exceptions=True)
        if drain.table is not None:
            await drain.table.close()
        await replica.stop()


def _register(settings: ReplicaSettings, background: Background) -> None:
    """Announce the replica on replica.state's row: the gateway checks it before routing here."""
    key = identity_key(settings.identity_key_path())
    registration = register_until_done(
        settings.platform.database_url, settings.replica_id, settings.url(), key, background.shutdown
    )
    background.run(registration, "replica-registration")


@asynccontextmanager
async def standalone(app: FastAPI) -> AsyncIterator[None]:
    """No control plane: ready at once."""
    async with _serving(app):
        app.state.replica.lifecycle.become_ready()
        yield


@asynccontextmanager
async def controlled(app: FastAPI) -> AsyncIterator[None]:
    """The control loop and the warm-up run beside the server; the replica turns ready once its owned
    adapters are warm (or warming times out)."""
    replica: Replica = app.state.replica
    table = app.state.drain.table
    settings = replica.settings
    async with _serving(app) as background:
        cache = replica.cache
        assert cache is not None and table is not None, "a controlled replica has a cache and a table"
        replica.lifecycle.begin_warming()  # before the first replica.state goes out
        since = datetime.now(UTC)
        control = supervise_control(
            settings.platform,
            settings.replica_id,
            cache,
            replica.replica_state,
            background.shutdown,
            settings.state_interval_s,
            nudge=replica.state_changed,
            dead_letters=replica.metrics.dead_letters,
            signing_key=state_key(identity_key(settings.identity_key_path())),
        )
        background.run(control, "replica-control")
        warming = warm_up(
            replica.lifecycle,
            table,
            cache.tier_of,
            since,
            settings.warming_timeout_s,
            settings.lifecycle_poll_s,
            replica.state_changed.set,
        )
        background.run(warming, "replica-warming", cancel=True)
        _register(settings, background)
        yield


@asynccontextmanager
async def merged(app: FastAPI) -> AsyncIterator[None]:
    """Ready once the adapter is fetched and folded into the weights; with a control plane it registers
    and publishes replica.state, and takes no commands."""
    replica: Replica = app.state.replica
    settings = replica.settings
    async with _serving(app) as background:
        replica.lifecycle.begin_warming()
        if settings.control_enabled:
            _register(settings, background)
        background.run(_merge(replica, background.shutdown), "replica-merge")
        if settings.control_enabled:
            state = publish_forever(
                settings.platform,
                replica.replica_state,
                background.shutdown,
                settings.state_interval_s,
                nudge=replica.state_changed,
                signing_key=state_key(identity_key(settings.identity_key_path())),
            )
            background.run(state, "replica-merged-state")
        yield


async def _merge(replica: Replica, shutdown: asyncio.Event) -> None:
    def merged() -> None:
        if replica.lifecycle.become_ready():  # not once a drain has begun
            replica.state_changed.set()

    await merge_until_done(replica.merge, shutdown, merged, retry_s=2.0)


LIFESPANS: dict[Mode, Lifespan] = {"standalone": standalone, "controlled": controlled, "merged": merged}
