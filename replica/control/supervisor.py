"""Keep the replica's control loop running for the life of the process: restart it after Kafka fails.

run_control stops when one of its loops dies (or Kafka cannot be reached at start); a replica that keeps
serving HTTP but no longer heartbeats would drop out of routing and placement, so it is started again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from prometheus_client import Counter

from lorafleet.config import PlatformSettings
from lorafleet.dead_letters import DEAD_LETTERS, DeadLetters
from replica.adapter_cache.cache import AdapterCache
from replica.adapter_cache.tier import CacheEvent
from replica.control.events import EventPublisher
from replica.control.service import run_control
from schemas.events import ReplicaState

log = logging.getLogger(__name__)


async def supervise_control(
    platform: PlatformSettings,
    replica_id: str,
    cache: AdapterCache,
    make_state: Callable[[], ReplicaState],
    shutdown: asyncio.Event,
    state_interval_s: float = 1.0,
    retry_s: float = 2.0,
    nudge: asyncio.Event | None = None,
    dead_letters: Counter = DEAD_LETTERS,
    signing_key: str | None = None,
) -> None:
    """Run the control loop until shutdown, restarting it retry_s after each failure; nudge sends the
    state at once. Commands that do not decode, or whose action keeps failing, go to the dead_letters table,
    counted in dead_letters."""
    events = EventPublisher(replica_id)
    letters = DeadLetters.own_pool("replica-commands", platform, dead_letters)
    local = cache.on_event  # the replica's metrics keep counting next to the published events

    def both(e: CacheEvent) -> None:
        local(e)
        events(e)

    cache.on_event = both
    try:
        while not shutdown.is_set():
            stop = asyncio.Event()  # run_control sets its stop event when it ends, so one per attempt
            forward = asyncio.create_task(_set_when(shutdown, stop))
            try:
                await run_control(
                    platform,
                    replica_id,
                    cache,
                    events,
                    make_state,
                    stop,
                    state_interval_s,
                    nudge,
                    letters,
                    signing_key,
                )
            except Exception as exc:  # noqa: BLE001 - Kafka down at start: keep serving, try again
                log.warning("replica control loop failed (%s: %s); retrying", type(exc).__name__, exc)
            finally:
                forward.cancel()
            if not shutdown.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(shutdown.wait(), retry_s)
    finally:
        await letters.close()


async def _set_when(source: asyncio.Event, target: asyncio.Event) -> None:
    await source.wait()
    target.set()
