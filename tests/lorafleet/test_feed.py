"""FeedWatch: ages run with the clock while the feed delivers, and stand still while it does not."""

from __future__ import annotations

import asyncio

from aiokafka.errors import KafkaConnectionError

from lorafleet.feed import FeedWatch


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Consumer:
    """end_offsets answers, fails or hangs, as a broker that is up, refusing or blackholed."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.asked = 0

    def assignment(self) -> set:
        return set()

    async def end_offsets(self, _parts: list) -> dict:
        self.asked += 1
        if self.mode == "refused":
            raise KafkaConnectionError("connection refused")
        if self.mode == "blackholed":
            await asyncio.sleep(60)
        return {}


def test_ages_follow_the_clock_until_the_feed_stops_delivering() -> None:
    clock = Clock()
    watch = FeedWatch(allowance_s=1.0, clock=clock)
    assert watch.now() == 100.0  # nothing known yet: the clock
    watch.delivered()
    clock.now = 100.4
    assert watch.now() == 100.4
    clock.now = 160.0
    assert watch.now() == 101.0 and watch.down_for() == 59.0
    watch.delivered()
    assert watch.now() == 160.0 and watch.down_for() == 0.0


async def test_an_empty_poll_asks_the_broker_and_only_its_answer_counts() -> None:
    clock = Clock()
    watch = FeedWatch(allowance_s=1.0, probe_timeout_s=0.05, clock=clock)
    await watch.after_poll(Consumer("up"), got_records=True)  # type: ignore[arg-type]
    assert watch.ok_at == 100.0
    for mode in ("refused", "blackholed"):
        clock.now += 5.0
        consumer = Consumer(mode)
        await watch.after_poll(consumer, got_records=False)  # type: ignore[arg-type]
        assert consumer.asked == 1 and watch.ok_at == 100.0, mode
    clock.now += 5.0
    up = Consumer("up")
    await watch.after_poll(up, got_records=False)  # type: ignore[arg-type]
    assert watch.ok_at == clock.now
    await watch.after_poll(up, got_records=False)  # type: ignore[arg-type]
    assert up.asked == 1  # confirmed just now: no second request
