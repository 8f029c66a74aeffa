"""Publish this replica's state on replica.state every second (membership, tiers, load)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from replica.adapter_cache.cache import AdapterCache
from schemas.events import ReplicaState, ReplicaStatus

if TYPE_CHECKING:
    from aiokafka import AIOKafkaProducer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Load:
    """The engine's side of the state: how much work is queued and in flight."""

    queue_depth: int
    tokens_in_flight: int


def build_state(
    replica_id: str, url: str, status: ReplicaStatus, cache: AdapterCache, gpu_slots: int, load: Load
) -> ReplicaState:
    tiers = cache.state()
    return ReplicaState(
        replica_id=replica_id,
        url=url,
        status=status,
        gpu_adapters=tiers.gpu_adapters,
        ram_adapters=tiers.ram_adapters,
        disk_adapters=tiers.disk_adapters,
        gpu_slots=gpu_slots,
        queue_depth=load.queue_depth,
        tokens_in_flight=load.tokens_in_flight,
        evictions_per_min=tiers.evictions_per_min,
        loads_per_min=tiers.loads_per_min,
    )


async def publish_state(
    producer: AIOKafkaProducer,  # started
    make_state: Callable[[], ReplicaState],
    stop: asyncio.Event,
    interval_s: float = 1.0,
) -> None:
    """Send make_state() every interval until stop; a failed send is logged and retried next tick."""
    while not stop.is_set():
        state = make_state()
        try:
            await producer.send(state.topic.name, state.to_bytes(), key=state.key().encode())
        except Exception:  # noqa: BLE001
            log.exception("could not publish replica state")
        try:
            await asyncio.wait_for(stop.wait(), interval_s)
        except TimeoutError:
            pass
