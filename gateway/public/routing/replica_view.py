"""The gateway's live replica table, fed by replica.state (every replica publishes once a second).

A replica is live while its last state arrived within stale_s (on this gateway's clock, never the sender's)
and says ready, and it has not failed a connection since that state. Ages count only while the feed itself
works (lorafleet/feed.py): a Kafka outage holds every replica as it was, rather than taking them all out of
routing. Load is the larger of what it reported and the tokens this gateway has in flight on it now, so the
router sees its own requests between two reports; its batch is what it reported, with the requests this
gateway sent since counted as waiting for prefill.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from aiokafka.structs import TopicPartition

from gateway.public.routing.hit_window import HitWindow
from gateway.public.routing.policy import ReplicaLoad
from lorafleet.config import PlatformSettings
from lorafleet.dead_letters import DeadLetters
from lorafleet.feed import FeedWatch
from lorafleet.kafka import make_consumer, seek_to_times
from lorafleet.replica_registry import ReplicaRegistry
from schemas import topics
from schemas.events import ReplicaState

log = logging.getLogger(__name__)

POLL_MS = 250  # an empty poll this long, and the feed is asked whether it still works


@dataclass
class _Sent:
    tokens: int = 0
    requests: int = 0
    prompt_tokens: int = 0


_NOTHING = _Sent()


@dataclass
class _Entry:
    state: ReplicaState
    received: float
    failed_at: float | None = None


class ReplicaView:
    """replica_id -> latest state; plus this gateway's own tokens in flight per replica."""

    def __init__(
        self, stale_s: float = 3.0, clock: Callable[[], float] = time.monotonic, replica_id_prefix: str = ""
    ) -> None:
        self.stale_s = stale_s
        self.clock = clock
        # when replica.state was last known to deliver: ages stand still while it does not
        self.feed = FeedWatch(allowance_s=min(1.0, stale_s / 3), clock=clock)
        # Only this fleet's replicas: replica.state is shared by every stack on one Kafka.
        self.replica_id_prefix = replica_id_prefix
        self._entries: dict[str, _Entry] = {}
        self._inflight: dict[str, int] = {}
        # what this gateway sent each replica since its last state: tokens, requests, prompt tokens
        self._since_state: dict[str, _Sent] = {}
        self._hits = HitWindow()

    def apply(self, state: ReplicaState) -> None:
        """Keep the newest state. Its age counts from when it arrived, on this gateway's clock: a replica
        whose clock is behind or ahead is as fresh as its last message. Newest is by the replica's own clock
        (a replay or a late copy of an older report changes nothing), but only while the state held is
        fresh: once it is stale, the next report wins whatever its time, so a report dated in the future
        (a clock stepped back since) holds a replica for stale_s at most."""
        if not state.replica_id.startswith(self.replica_id_prefix):
            return
        now = self.clock()
        current = self._entries.get(state.replica_id)
        if (
            current is not None
            and current.state.occurred_at > state.occurred_at
            and now - current.received <= self.stale_s
        ):
            return
        self._entries[state.replica_id] = _Entry(state, now)
        self._since_state.pop(state.replica_id, None)

    def mark_failed(self, replica_id: str) -> None:
        """A connection to it failed: not live until it reports again."""
        entry = self._entries.get(replica_id)
        if entry is not None:
            entry.failed_at = self.clock()

    def add_inflight(self, replica_id: str, tokens: int, prompt_tokens: int = 0) -> None:
        """A request of tokens (its prompt_tokens among them) sent to the replica, or, negative, ended."""
        self._inflight[replica_id] = max(0, self._inflight.get(replica_id, 0) + tokens)
        if tokens > 0:
            sent = self._since_state.setdefault(replica_id, _Sent())
            sent.tokens += tokens
            sent.requests += 1
            sent.prompt_tokens += prompt_tokens

    def load_of(self, replica_id: str, reported: int) -> int:
        """A replica's tokens in flight as this gateway best knows them: its last report (every gateway's
        requests) plus what this gateway sent it since, or this gateway's own reservations if more. Its own
        alone would show each of several gateways only its share, and each would fill an owner past its
        room before spilling."""
        sent = self._since_state.get(replica_id)
        return max(reported + (sent.tokens if sent else 0), self.inflight(replica_id))

    def inflight(self, replica_id: str) -> int:
        return self._inflight.get(replica_id, 0)

    def record_tier(self, replica_id: str, tier: str | None) -> None:
        """Where a request this gateway routed to replica_id found its adapter."""
        self._hits.record(replica_id, tier == "gpu", self.clock())

    def gpu_hit_rate(self, replica_id: str) -> float | None:
        """Of the last minute's requests this gateway routed there, the share served from a GPU slot."""
        return self._hits.rate(replica_id, self.clock())

    def states(self) -> list[tuple[ReplicaState, float]]:
        """Every replica's newest state with its age in seconds (stale ones included), by replica id."""
        now = self.feed.now()
        return [(e.state, max(0.0, now - e.received)) for _, e in sorted(self._entries.items())]

    def live(self) -> list[ReplicaLoad]:
        now = self.feed.now()
        out = []
        for rid, e in self._entries.items():
            if now - e.received > self.stale_s or e.state.status != "ready":
                continue
            if e.failed_at is not None and e.failed_at >= e.received:
                continue
            sent = self._since_state.get(rid, _NOTHING)
            out.append(
                ReplicaLoad(
                    replica_id=rid,
                    url=e.state.url,
                    tokens_in_flight=self.load_of(rid, e.state.tokens_in_flight),
                    resident=frozenset(e.state.gpu_adapters) | frozenset(e.state.ram_adapters),
                    gpu=frozenset(e.state.gpu_adapters),
                    merged=e.state.merged_adapter_id,
                    gpu_slots=e.state.gpu_slots,
                    # what it reported of its batch, and the requests sent since as if still waiting
                    running=e.state.running,
                    waiting=e.state.queue_depth + sent.requests,
                    max_running=e.state.max_running,
                    prefill_tokens=e.state.prefill_tokens + sent.prompt_tokens,
                )
            )
        return out


async def consume_states(
    platform: PlatformSettings,
    view: ReplicaView,
    ready: asyncio.Event,
    letters: DeadLetters,
    registry: ReplicaRegistry | None = None,
    rejected: Callable[[ReplicaState, str], None] | None = None,
) -> None:
    """Read replica.state from the newest offsets of every partition (no group: every gateway sees all);
    ready is set once it has read the topic to its end, so that ages count from a confirmed delivery.

    With a registry, a state is applied only if its (replica_id, url) is registered and it carries that
    replica's signature; others go to rejected. A record that does not decode goes to letters."""
    consumer = make_consumer(platform, group_id=None, enable_auto_commit=False)
    await consumer.start()
    try:
        parts = [TopicPartition(topics.REPLICA_STATE.name, p) for p in range(topics.REPLICA_STATE.partitions)]
        consumer.assign(parts)
        # States are per second: the last few seconds are enough to know the fleet at start-up.
        since_ms = int((time.time() - view.stale_s) * 1000)
        await seek_to_times(consumer, dict.fromkeys(parts, since_ms))
        while True:
            batch = await consumer.getmany(timeout_ms=POLL_MS)
            for msg in (m for records in batch.values() for m in records):
                event = await letters.parse_following(msg.topic, msg.partition, msg.offset, msg.value)
                if event is None:
                    continue
                assert isinstance(event, ReplicaState)
                if not event.replica_id.startswith(view.replica_id_prefix):
                    continue  # another fleet's replica on the same Kafka
                if registry is not None and not registry.believes(
                    event, msg.value or b"", msg.headers, rejected
                ):
                    continue
                view.apply(event)
            await view.feed.after_batch(consumer, parts)
            if view.feed.ok_at is not None:  # read to its end once: every replica reporting now is known
                ready.set()
    finally:
        view.feed.close()
        await consumer.stop()
