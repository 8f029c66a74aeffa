"""A consumed event's handler is retried a few times and then dead-lettered when it keeps failing, unless
the failure is the infrastructure's: that one is raised at once, so nothing is dead-lettered during an
outage and the consumer reads the record again once the service is back. A follower, which commits no
offsets, dead-letters its pure handler's failure at once and goes on."""

from __future__ import annotations

import asyncpg
import pytest

from lorafleet.settle import is_transient, settle, settle_following


class Letters:
    consumer = "test"

    def __init__(self) -> None:
        self.recorded: list[tuple[str, int, int, bytes | None, str]] = []

    async def record(self, topic: str, partition: int, offset: int, value: bytes | None, reason: str) -> None:
        self.recorded.append((topic, partition, offset, value, reason))

    async def record_following(
        self, topic: str, partition: int, offset: int, value: bytes | None, reason: str
    ) -> None:
        await self.record(topic, partition, offset, value, reason)


class Flaky:
    def __init__(self, errors: list[Exception]) -> None:
        self.errors = errors
        self.calls = 0

    async def __call__(self) -> None:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)


WHERE = ("replica.state", 3, 41, b"{}")


async def test_a_handler_that_keeps_failing_is_dead_lettered_with_its_error_after_its_attempts() -> None:
    letters, handler = Letters(), Flaky([ValueError("bad data")] * 5)
    assert not await settle(handler, letters, *WHERE, attempts=3, backoff_s=0)  # type: ignore[arg-type]
    assert handler.calls == 3
    ((topic, partition, offset, value, reason),) = letters.recorded
    assert (topic, partition, offset, value) == WHERE
    assert "failed 3 times" in reason and "ValueError: bad data" in reason


async def test_a_subject_begins_the_reason_when_the_record_alone_does_not_say_what_failed() -> None:
    letters, handler = Letters(), Flaky([ValueError("bad data")] * 2)
    assert not await settle(handler, letters, *WHERE, attempts=2, backoff_s=0, subject="window 12:00")  # type: ignore[arg-type]
    assert letters.recorded[0][4] == "window 12:00: the handler failed 2 times: ValueError: bad data"


async def test_a_failure_that_passes_is_retried_and_nothing_is_dead_lettered() -> None:
    letters, handler = Letters(), Flaky([KeyError("once")])
    assert await settle(handler, letters, *WHERE, attempts=3, backoff_s=0)  # type: ignore[arg-type]
    assert handler.calls == 2 and letters.recorded == []


@pytest.mark.parametrize(
    "error",
    [
        ConnectionRefusedError(),
        TimeoutError(),
        asyncpg.exceptions.ConnectionDoesNotExistError("gone"),
        asyncpg.exceptions.QueryCanceledError("statement timeout"),
        asyncpg.exceptions.SerializationError("could not serialize"),
        asyncpg.exceptions.CannotConnectNowError("starting up"),
    ],
    ids=type,
)
async def test_the_infrastructures_failures_are_raised_at_once_never_dead_lettered(error: Exception) -> None:
    assert is_transient(error)
    letters, handler = Letters(), Flaky([error])
    with pytest.raises(type(error)):
        await settle(handler, letters, *WHERE, attempts=3, backoff_s=0)  # type: ignore[arg-type]
    assert handler.calls == 1 and letters.recorded == []


def test_data_and_integrity_errors_are_the_handlers() -> None:
    assert not is_transient(asyncpg.exceptions.ForeignKeyViolationError("no such adapter"))
    assert not is_transient(asyncpg.exceptions.DataError("bad value"))
    assert not is_transient(ValueError("bug"))


async def test_a_consumers_own_transient_type_is_raised_for_its_own_retry() -> None:
    class StoreDown(Exception):
        pass

    letters, handler = Letters(), Flaky([StoreDown()])
    with pytest.raises(StoreDown):
        await settle(handler, letters, *WHERE, transient=(StoreDown,), backoff_s=0)  # type: ignore[arg-type]
    assert letters.recorded == []


async def test_a_followers_handler_that_raises_is_dead_lettered_at_once_and_gives_none() -> None:
    letters, calls = Letters(), []

    def take() -> int:
        calls.append(1)
        raise TypeError("can't compare offset-naive and offset-aware datetimes")

    assert await settle_following(take, letters, *WHERE) is None  # type: ignore[arg-type]
    assert len(calls) == 1
    ((topic, partition, offset, value, reason),) = letters.recorded
    assert (topic, partition, offset, value) == WHERE
    assert reason == "the handler failed: TypeError: can't compare offset-naive and offset-aware datetimes"
    assert await settle_following(lambda: 7, letters, *WHERE) == 7  # type: ignore[arg-type]
    assert len(letters.recorded) == 1


async def test_a_value_made_on_demand_is_made_only_for_a_dead_letter() -> None:
    made: list[int] = []

    def value() -> bytes:
        made.append(1)
        return b"the window's events"

    letters = Letters()
    assert await settle(Flaky([]), letters, "t", 0, 1, value, backoff_s=0.0)  # type: ignore[arg-type]
    assert made == [] and letters.recorded == []
    failing = Flaky([ValueError("refused")] * 3)
    assert not await settle(failing, letters, "t", 0, 2, value, backoff_s=0.0)  # type: ignore[arg-type]
    assert made == [1] and letters.recorded[0][3] == b"the window's events"
