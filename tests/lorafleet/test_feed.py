"""FeedWatch: ages run with the clock while the feed is read to its end, and stand still while the broker
does not answer or the reader is behind it."""

from __future__ import annotations

import asyncio

from aiokafka import TopicPartition
from aiokafka.errors import KafkaConnectionError

from lorafleet.feed import FeedWatch

PART = TopicPartition("replica.state", 0)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Consumer:
    """A reader at `read` of a partition whose end is `end`; end_offsets answers, fails or hangs, as a
    broker that is up, refusing or blackholed."""

    def __init__(self, mode: str = "up", end: int = 0, read: int = 0) -> None:
        self.mode, self.end, self.read = mode, end, read
        self.asked = 0

    async def end_offsets(self, parts: list) -> dict:
        self.asked += 1
        if self.mode == "refused":
            raise KafkaConnectionError("connection refused")
        if self.mode == "blackholed":
            await asyncio.sleep(60)
        return dict.fromkeys(parts, self.end)

    async def position(self, _part: TopicPartition) -> int:
        return self.read


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


async def _poll(watch: FeedWatch, consumer: Consumer, settle_s: float = 0.01) -> None:
    """One poll's after_batch, then time for a request it started to be answered (or to time out)."""
    await watch.after_batch(consumer, [PART])  # type: ignore[arg-type]
    await asyncio.sleep(settle_s)


async def test_only_the_brokers_answer_counts_and_not_more_than_twice_an_allowance() -> None:
    clock = Clock()
    watch = FeedWatch(allowance_s=1.0, probe_timeout_s=0.05, clock=clock)
    up = Consumer()
    await _poll(watch, up)  # asks in the background
    await _poll(watch, up)  # the answer: nothing unread
    assert watch.ok_at == 100.0 and up.asked == 1
    for mode in ("refused", "blackholed"):
        clock.now += 5.0
        down = Consumer(mode)
        await _poll(watch, down, 0.1)
        await _poll(watch, down)
        assert down.asked == 1 and watch.ok_at == 100.0, mode
        assert watch.now() == 101.0  # ages held
    clock.now += 5.0
    await _poll(watch, up)
    await _poll(watch, up)
    assert watch.ok_at == clock.now
    await _poll(watch, up)
    assert up.asked == 2  # confirmed just now: no further request


async def test_the_poll_loop_never_waits_on_the_broker() -> None:
    watch = FeedWatch(allowance_s=1.0, probe_timeout_s=30.0, clock=Clock())
    blackholed = Consumer("blackholed")
    await asyncio.wait_for(_poll(watch, blackholed), 0.5)  # the request hangs; the poll returns at once
    assert blackholed.asked == 1
    watch.close()  # a reader that stops cancels the request


async def test_a_reader_behind_its_topic_holds_the_ages_until_it_passes_the_end_it_was_told() -> None:
    clock = Clock()
    watch = FeedWatch(allowance_s=1.0, clock=clock)
    watch.delivered()
    reader = Consumer(end=1_000, read=200)  # a burst of other events kept it busy
    clock.now = 105.0
    await _poll(watch, reader)
    await _poll(watch, reader)
    assert watch.ok_at == 100.0 and watch.now() == 101.0  # 800 reports unread: nobody ages
    for read in (500, 999):
        clock.now += 4.0
        reader.read = read
        await _poll(watch, reader)
        assert watch.now() == 101.0 and reader.asked == 1  # still reading toward the same end
    # more reports arrived meanwhile: only the end it was told counts, so a busy topic is never out of reach
    reader.read, reader.end = 1_000, 1_300
    clock.now = 130.0
    await _poll(watch, reader)
    assert watch.ok_at == 105.0  # every report sent before it asked has been applied
    assert reader.asked == 2  # and it asks again, for the end as it is now
    reader.read = 1_300
    await _poll(watch, reader)
    clock.now = 130.2
    await _poll(watch, reader)
    assert watch.ok_at == 130.0 and watch.now() == 130.2


async def test_a_log_truncated_under_the_reader_is_waited_for_only_as_far_as_it_still_goes() -> None:
    clock = Clock()
    watch = FeedWatch(allowance_s=1.0, clock=clock)
    reader = Consumer(end=1_000, read=200)
    await _poll(watch, reader)
    reader.end, reader.read = 300, 300  # the broker came back without its data; the reader reset to its end
    clock.now = 105.0
    await _poll(watch, reader)
    await _poll(watch, reader)
    assert watch.ok_at is None and reader.asked == 1  # not asked again before 10 allowances
    clock.now = 110.0
    await _poll(watch, reader)  # asks again
    await _poll(watch, reader)  # what still exists has been read
    assert watch.ok_at == 100.0 and reader.asked == 2
