"""Publish this replica's state on replica.state every second and on every change of status (membership,
tiers, load, warming progress)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from lorafleet.state_signature import SIGNATURE_HEADER, sign
from replica.adapter_cache.cache import CacheState
from schemas.events import ReplicaState, ReplicaStatus

if TYPE_CHECKING:
    from aiokafka import AIOKafkaProducer

log = logging.getLogger(__name__)


class Tiers(Protocol):
    """Where the adapters are: replica.adapter_cache.AdapterCache, or a stand-in's modeled tiers."""

    def state(self) -> CacheState: ...


@dataclass(frozen=True)
class Load:
    """The engine's side of the state: how much work is queued and in flight."""

    queue_depth: int
    tokens_in_flight: int
    kv_usage: float = 0.0  # share of KV blocks held
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache since start
    prefix_cache_hits: int = 0  # and found there
    running: int = 0  # rows of the batch in use
    max_running: int = 0  # the batch's rows (0: not reported)
    prefill_tokens: int = 0  # prompt tokens of waiting and running requests not yet prefilled


def build_state(
    replica_id: str,
    url: str,
    status: ReplicaStatus,
    cache: Tiers,
    gpu_slots: int,
    load: Load,
    owned_adapters: int = 0,
    warm_adapters: int = 0,
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
        running=load.running,
        max_running=load.max_running,
        prefill_tokens=load.prefill_tokens,
        evictions_per_min=tiers.evictions_per_min,
        loads_per_min=tiers.loads_per_min,
        owned_adapters=owned_adapters,
        warm_adapters=warm_adapters,
        kv_usage=load.kv_usage,
        prefix_cache_queries=load.prefix_cache_queries,
        prefix_cache_hits=load.prefix_cache_hits,
    )


async def publish_state(
    producer: AIOKafkaProducer,  # started
    make_state: Callable[[], ReplicaState],
    stop: asyncio.Event,
    interval_s: float = 1.0,
    nudge: asyncio.Event | None = None,
    signing_key: str | None = None,
) -> None:
    """Send make_state() every interval until stop, and at once when nudge is set (a new status), each
    signed with signing_key (the gateway drops an unsigned state); a failed send is logged and retried next
    tick."""
    nudge = nudge or asyncio.Event()
    while not stop.is_set():
        nudge.clear()
        state = make_state()
        value = state.to_bytes()
        headers = [(SIGNATURE_HEADER, sign(signing_key, value))] if signing_key else None
        try:
            await producer.send(state.topic.name, value, key=state.key().encode(), headers=headers)
        except Exception:  # noqa: BLE001
            log.exception("could not publish replica state")
        waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(nudge.wait())]
        try:
            await asyncio.wait(waits, timeout=interval_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
