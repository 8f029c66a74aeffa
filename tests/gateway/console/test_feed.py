from datetime import UTC, datetime, timedelta

from gateway.console.feed import ConsoleFeed
from schemas.events import AdapterStats, Alert

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def stats(adapter_id: str, minute: int, tokens_per_s: float = 1.0) -> AdapterStats:
    return AdapterStats(
        adapter_id=adapter_id,
        window_start=T0 + timedelta(minutes=minute),
        window_seconds=60,
        requests=5,
        tokens_per_s=tokens_per_s,
        gpu_hit_rate=0.5,
    )


def alert(subject: str) -> Alert:
    return Alert(subject=subject, kind="slo_ttft", message="slow", value=2.0, threshold=1.0)


def test_each_adapter_keeps_its_newest_window_and_the_busiest_come_first() -> None:
    feed = ConsoleFeed()
    feed.apply(stats("a", 2, tokens_per_s=1.0))
    feed.apply(stats("a", 1, tokens_per_s=99.0))  # an older window arriving late changes nothing
    feed.apply(stats("b", 1, tokens_per_s=5.0))
    assert [(w.adapter_id, w.tokens_per_s) for w in feed.windows()] == [("b", 5.0), ("a", 1.0)]
    assert [w.adapter_id for w in feed.windows({"a"})] == ["a"]


def test_the_adapter_table_is_bounded_by_dropping_the_oldest_window() -> None:
    feed = ConsoleFeed(max_adapters=2)
    for i, name in enumerate(("a", "b", "c")):
        feed.apply(stats(name, i))
    assert {w.adapter_id for w in feed.windows()} == {"b", "c"}


def test_alerts_come_newest_first_once_each_and_bounded() -> None:
    feed = ConsoleFeed(max_alerts=2)
    first, second, third = alert("t1"), alert("t2"), alert("t3")
    feed.apply(first)
    feed.apply(first)  # redelivered: the same event id
    feed.apply(second)
    assert [a.subject for a in feed.alerts()] == ["t2", "t1"]
    feed.apply(third)
    assert [a.subject for a in feed.alerts()] == ["t3", "t2"]
