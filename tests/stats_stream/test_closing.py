import pytest

from stats_stream.closing import close_window
from stats_stream.config import SignalSettings
from stats_stream.signals import ScaleState
from stats_stream.windows import to_ms
from tests.stats_stream.builders import T0, replica_event, request, state

S = SignalSettings(window_s=60, thrash_evictions_per_min=30, slo_ttft_s=1.0, scale_down_windows=2)
W = to_ms(T0)


def busy_window() -> list:
    slow = [request("a-slow", tenant="slowco", ttft=2.0, tier="remote") for _ in range(10)]
    hot = [request("a-hot", tenant="acme", ttft=0.1, completion=60 * 700 // 20) for _ in range(20)]
    evictions = [replica_event("rep-1", "evict", t=i) for i in range(40)]
    states = [state("rep-1", queue=30, tokens=1000), state("rep-2", queue=20, tokens=1000)]
    return slow + hot + evictions + states


def test_a_window_yields_adapter_stats_alerts_and_an_autoscale_signal() -> None:
    report = close_window(W, busy_window(), ScaleState(), S)
    stats = {s.adapter_id: s for s in report.adapter_stats}
    assert stats["a-slow"].requests == 10 and stats["a-slow"].gpu_hit_rate == 0.0
    assert stats["a-hot"].tokens_per_s == pytest.approx(700.0)
    assert all(s.window_start == T0 and s.window_seconds == 60 for s in stats.values())
    assert {(a.kind, a.subject) for a in report.alerts} == {("slo_ttft", "slowco"), ("thrashing", "rep-1")}
    assert report.autoscale.current_replicas == 2
    assert report.autoscale.desired_replicas == 10  # ceil(50 queued / 5 per replica)
    assert [(h.adapter_id, h.owners) for h in report.autoscale.hot_adapters] == [("a-hot", 2)]
    assert report.scale_state.previous == 10


def test_closing_the_same_window_twice_gives_the_same_event_ids() -> None:
    events = busy_window()
    first, second = close_window(W, events, ScaleState(), S), close_window(W, events, ScaleState(), S)
    assert [s.event_id for s in first.adapter_stats] == [s.event_id for s in second.adapter_stats]
    assert [a.event_id for a in first.alerts] == [a.event_id for a in second.alerts]
    assert first.autoscale.event_id == second.autoscale.event_id
    assert close_window(W + 60_000, events, ScaleState(), S).autoscale.event_id != first.autoscale.event_id


def test_events_delivered_twice_are_counted_once() -> None:
    events = busy_window()
    once, twice = close_window(W, events, ScaleState(), S), close_window(W, events + events, ScaleState(), S)
    assert [s.model_dump() for s in twice.adapter_stats] == [s.model_dump() for s in once.adapter_stats]
    assert twice.churn == once.churn


def test_an_empty_window_still_says_how_many_replicas_are_wanted() -> None:
    report = close_window(W, [], ScaleState(previous=3, recent=(3,)), S)
    assert report.adapter_stats == [] and report.alerts == []
    assert report.autoscale.desired_replicas == 3 and report.autoscale.current_replicas == 0


def test_the_fleet_bill_is_charged_to_tenants() -> None:
    report = close_window(W, busy_window(), ScaleState(), S)
    assert sum(c.cost_usd for c in report.costs.values()) == pytest.approx(2 * 2.5 / 60)
    assert report.tier_shares["remote"] == pytest.approx(10 / 30)


def test_only_the_fleets_own_replicas_count_towards_its_size_load_and_churn() -> None:
    scoped = S.model_copy(update={"replica_id_prefix": "rep-1"})
    report = close_window(W, busy_window(), ScaleState(), scoped)
    assert report.autoscale.current_replicas == 1  # rep-2 belongs to another stack on the same Kafka
    assert report.load.queue_depth == 30
    assert report.autoscale.desired_replicas == 6  # ceil(30 queued / 5 per replica)
    assert set(report.churn) == {"rep-1"}


def test_merged_replicas_are_not_counted_in_the_fleet_the_signal_sizes() -> None:
    merged = state("rep-9", queue=50, tokens=1000).model_copy(update={"merged_adapter_id": "a-hot"})
    report = close_window(W, [*busy_window(), merged], ScaleState(), S)
    assert report.autoscale.current_replicas == 2
    assert report.load.queue_depth == 50


def test_the_signal_says_how_many_replicas_thrash_and_what_the_active_adapters_need() -> None:
    requests = [request(f"a{i}") for i in range(5)]  # five adapters on rep-1
    states = [state("rep-1", gpu_slots=2), state("rep-2", gpu_slots=4)]
    evictions = [replica_event("rep-1", "evict", t=i) for i in range(40)]
    signal = close_window(W, requests + states + evictions, ScaleState(), S).autoscale
    assert (signal.thrashing_replicas, signal.active_adapters, signal.slot_demand) == (1, 5, 3)
    quiet = close_window(W, states, ScaleState(), S).autoscale
    assert (quiet.thrashing_replicas, quiet.active_adapters, quiet.slot_demand) == (0, 0, 0)


def test_the_slot_demand_counts_the_adapters_of_every_window_a_scale_down_waits_for() -> None:
    """Sparse traffic: four adapters asked for in turn, two per window. Each window alone says one replica's
    slots hold them; over the windows a scale-down waits for, they need two replicas."""
    states = [state("rep-1", gpu_slots=2), state("rep-2", gpu_slots=2)]
    scale, demands = ScaleState(), []
    for n in range(S.scale_down_windows + 2):
        pair = [request(f"a{(2 * n + i) % 4}") for i in range(2)]
        report = close_window(W + n * 60_000, pair + states, scale, S)
        scale = report.scale_state
        demands.append(report.autoscale.slot_demand)
    assert demands == [1] + [2] * (S.scale_down_windows + 1)
    assert len(scale.active) == S.scale_down_windows  # no more windows remembered than the span
    assert ScaleState.from_json(scale.to_json()) == scale  # kept in the table between windows
