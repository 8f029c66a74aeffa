"""How long a Kafka feed of heartbeats has been known to deliver, so that its own outage ages nothing.

A follower of replica.state judges a replica by when its last report arrived. While the broker is down no
report arrives from anyone, and by that rule every replica would go stale together: the gateway would
refuse every chat and the placement worker would replan an empty fleet, although the replicas are serving.
So ages count up to the last moment the feed was known to work: a poll that returned records, or, when a
poll returned none, the broker answering a cheap request (the partitions' end offsets). While the feed is
down the ages stand still; a replica that died meanwhile is found by the data path (a failed connection
marks it failed), and once the feed is back every silent replica ages again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer
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
        self._down_logged = False

    def delivered(self) -> None:
        """The feed works now."""
        if self._down_logged:
            log.info("the replica.state feed delivers again")
            self._down_logged = False
        self.ok_at = self.clock()

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

    async def after_poll(self, consumer: AIOKafkaConsumer, got_records: bool) -> None:
        """Call after every poll: records prove the feed works; an empty poll asks the broker, at most once
        per allowance_s, for the end offsets of the consumer's partitions."""
        if got_records:
            self.delivered()
            return
        if self.ok_at is not None and self.clock() - self.ok_at < self.allowance_s / 2:
            return
        parts = list(consumer.assignment())
        try:
            await asyncio.wait_for(consumer.end_offsets(parts), self.probe_timeout_s)
        except (KafkaError, OSError, TimeoutError) as exc:
            if not self._down_logged and self.down_for() > 0:
                log.warning("the replica.state feed does not answer (%r): replica ages are held", exc)
                self._down_logged = True
            return
        self.delivered()
