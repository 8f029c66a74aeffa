from datetime import timedelta

from schemas.events import AdapterStats, Alert, AutoscaleSignal, HotAdapter
from stats_stream.picture import render, summarize
from tests.stats_stream.builders import T0


def stats(adapter: str, tps: float, hit: float, requests: int, minute: int = 0) -> AdapterStats:
    return AdapterStats(
        adapter_id=adapter,
        window_start=T0 + timedelta(minutes=minute),
        window_seconds=60,
        requests=requests,
        tokens_per_s=tps,
        gpu_hit_rate=hit,
    )


def test_the_picture_ranks_adapters_by_their_latest_window_and_weights_the_hit_rate() -> None:
    old = stats("a", 900, 1.0, 10, minute=0)
    events = [old, old, stats("a", 50, 0.5, 10, minute=1), stats("b", 100, 1.0, 30, minute=1)]
    picture = summarize(events, top=5)
    assert [a["adapter_id"] for a in picture["top_adapters"]] == ["b", "a"]
    assert picture["fleet"]["requests"] == 40
    assert picture["fleet"]["gpu_hit_rate"] == (0.5 * 10 + 1.0 * 30) / 40


def test_the_picture_lists_newest_alerts_first_and_the_latest_autoscale_signal() -> None:
    alerts = [
        Alert(
            occurred_at=T0 + timedelta(minutes=m),
            subject=f"t{m}",
            kind="slo_ttft",
            message=f"m{m}",
            value=2,
            threshold=1,
        )
        for m in range(3)
    ]
    signals = [
        AutoscaleSignal(
            occurred_at=T0 + timedelta(minutes=m), current_replicas=2, desired_replicas=2 + m, reason="r"
        )
        for m in range(2)
    ]
    hot = AutoscaleSignal(
        occurred_at=T0 + timedelta(minutes=5),
        current_replicas=3,
        desired_replicas=4,
        reason="scale up",
        hot_adapters=[HotAdapter(adapter_id="big", tokens_per_s=2000, owners=4)],
    )
    picture = summarize([*alerts, *signals, hot])
    assert [a["subject"] for a in picture["alerts"]] == ["t2", "t1", "t0"]
    assert picture["autoscale"]["desired_replicas"] == 4
    text = render(picture)
    assert "bigx4" in text and "3 -> 4 replicas" in text and "m2" in text


def test_an_empty_picture_renders() -> None:
    text = render(summarize([]))
    assert "no signal yet" in text and "alerts: none" in text
