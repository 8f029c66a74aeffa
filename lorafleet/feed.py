"""How long a Kafka feed of heartbeats has been known to deliver, so that neither its outage nor its reader's
backlog ages anything.

A follower of replica.state judges a replica by when its last report arrived. While the broker is down no
report arrives from anyone, and by that rule every replica would go stale together: the gateway would
refuse every chat and the placement worker would replan an empty fleet, although the replicas are serving.
The same happens when the follower falls behind its topic: a report waiting unread is as good as lost, and
a worker busy with a burst of other events would drop replicas that report on time, replan, and fall
further behind.

So ages count up to the last moment the feed is known to have been read to its end: the follower asks the
broker for the partitions' end offsets, and once its own position has passed them, every report sent
before it asked has been applied. While the broker does not answer, or the follower has not read that far,
ages stand still; a replica that died meanwhile is found by the data path (a failed connection marks it
failed), and once the follower has caught up every silent replica ages again.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Collection

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

log = logging.getLogger(__name__)


class FeedWatch:
    """The last time a feed was known to deliver, and the time to age its reports against."""

    def __init__(
        self,
        allowance_s: float = 1.0,
        probe_timeout_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # a working feed is confirmed at least every allowance_s: until then its reports age in real time
        self.allowance_s = allowance_s
        self.probe_timeout_s = probe_timeout_s
        self.clock = clock
        self.ok_at: float | None = None
        # (when the end offsets were asked, the offsets): delivered once the consumer's position passes them
        self._target: tuple[float, dict[TopicPartition, int]] | None = None
        self._asked_at = -math.inf
        self._probe: asyncio.Future[tuple[float, dict[TopicPartition, int]]] | None = None
        self._down_logged = False
        self._behind_logged = False

    def delivered(self, at: float | None = None) -> None:
        """Every report sent before `at` (default: now) has been applied."""
        if self._down_logged:
            log.info("the replica.state feed delivers again")
            self._down_logged = False
        at = self.clock() if at is None else at
        self.ok_at = at if self.ok_at is None else max(at, self.ok_at)

    def now(self) -> float:
        """The clock while the feed works; frozen at its last delivery (plus the allowance) while it is down.
        Before any delivery it is the clock."""
        now = self.clock()
        if self.ok_at is None:
            return now
        return min(now, self.ok_at + self.allowance_s)

    def down_for(self) -> float:
        """Seconds since the feed was last known to work beyond the allowance (0 while it works)."""
        return 0.0 if self.ok_at is None else max(0.0, self.clock() - self.ok_at - self.allowance_s)

    async def after_batch(self, consumer: AIOKafkaConsumer, parts: Collection[TopicPartition]) -> None:
        """Call after every poll, once its records are applied. At most once per allowance_s/2 it asks the
        broker for the end offsets of parts, in the background: the poll loop never waits on the answer, so a
        slow broker cannot put its reader behind. The moment it asked counts as delivered once the
        consumer's position has passed those offsets, on a later poll. Records alone prove nothing: a
        consumer behind its topic has not seen the newest reports."""
        self._collect()
        if self._target is not None:
            try:
                await self._reached(consumer)
            except KafkaError:  # a partition no longer assigned: ask again
                self._target = None
        now = self.clock()
        due = (
            self._target is None
            and (self.ok_at is None or now - self.ok_at >= self.allowance_s / 2)
            and now - self._asked_at >= self.allowance_s / 2  # a failed broker is asked again, not hammered
        )
        # A log truncated under the reader (a broker restored without its data) can end below the offsets
        # it was told: every 10 allowances it asks again, and then waits only for what still exists.
        recheck = self._target is not None and now - self._asked_at >= 10 * self.allowance_s
        if (due or recheck) and self._probe is None:
            self._asked_at = now
            self._probe = asyncio.ensure_future(self._ask(consumer, list(parts)))

    def close(self) -> None:
        """Stop a request to the broker still under way (the reader is stopping)."""
        if self._probe is not None:
            self._probe.cancel()
            self._probe = None

    async def _ask(
        self, consumer: AIOKafkaConsumer, parts: list[TopicPartition]
    ) -> tuple[float, dict[TopicPartition, int]]:
        asked = self.clock()
        return asked, await asyncio.wait_for(consumer.end_offsets(parts), self.probe_timeout_s)

    def _collect(self) -> None:
        """A finished request becomes the target, or lowers the one pending to the offsets that exist."""
        if self._probe is None or not self._probe.done():
            return
        probe, self._probe = self._probe, None
        try:
            asked, ends = probe.result()
        except (KafkaError, OSError, TimeoutError, asyncio.CancelledError) as exc:
            if not self._down_logged and self.down_for() > 0:
                log.warning("the replica.state feed does not answer (%r): replica ages are held", exc)
                self._down_logged = True
            return
        if self._target is None:
            self._target = (asked, ends)
        else:
            first, told = self._target
            self._target = (first, {tp: min(end, ends.get(tp, end)) for tp, end in told.items()})

    async def _reached(self, consumer: AIOKafkaConsumer) -> bool:
        assert self._target is not None
        asked, ends = self._target
        unread = 0
        for tp, end in ends.items():
            unread += max(0, end - await consumer.position(tp))
        if unread:
            if not self._behind_logged and self.down_for() > 10 * self.allowance_s:  # not a busy second
                log.warning("%d replica.state reports are not read yet: replica ages are held", unread)
                self._behind_logged = True
            return False
        if self._behind_logged:
            log.info("the replica.state feed is read to its end again")
            self._behind_logged = False
        self._target = None
        self.delivered(asked)
        return True
