"""A merged replica's control side: fold its adapter in, then keep publishing replica.state.

It has no adapter cache and takes no replica.commands (it serves only its merged adapter), so instead of
the control loop it runs two tasks: merge() retried until it succeeds (the registry or the object store
may not answer yet; the actuator stops a replica that never turns ready), and replica.state published
every interval, warming until the adapter is merged and ready after, with merged_adapter_id set.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from lorafleet.config import PlatformSettings
from lorafleet.kafka import make_producer
from replica.control.state_publisher import publish_state
from schemas.events import ReplicaState

log = logging.getLogger(__name__)


async def merge_until_done(
    merge: Callable[[], Awaitable[None]],
    shutdown: asyncio.Event,
    on_merged: Callable[[], None],
    retry_s: float,
) -> None:
    """Call merge() until it returns (then on_merged()), retry_s after each failure, or until shutdown."""
    while not shutdown.is_set():
        try:
            await merge()
        except Exception as exc:  # noqa: BLE001 - fetch or validation failed: not served, try again
            log.error("cannot merge the adapter (%s: %s); retrying", type(exc).__name__, exc)
        else:
            on_merged()
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(shutdown.wait(), retry_s)


async def publish_forever(
    platform: PlatformSettings,
    make_state: Callable[[], ReplicaState],
    shutdown: asyncio.Event,
    interval_s: float,
    nudge: asyncio.Event | None = None,
    retry_s: float = 2.0,
    signing_key: str | None = None,
) -> None:
    """Publish make_state() every interval (and at once when nudge is set: a new status) until shutdown,
    with a new producer after Kafka fails."""
    while not shutdown.is_set():
        producer = make_producer(platform)
        try:
            await producer.start()
            await publish_state(producer, make_state, shutdown, interval_s, nudge, signing_key)
        except Exception as exc:  # noqa: BLE001 - Kafka down: keep serving, try again
            log.warning("merged replica state loop failed (%s: %s); retrying", type(exc).__name__, exc)
        finally:
            with contextlib.suppress(Exception):
                await producer.stop()
        if not shutdown.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(shutdown.wait(), retry_s)
