import pytest

from stats_stream.aggregates import AdapterWindow, FleetLoad, ReplicaChurn, TenantLatency
from stats_stream.config import SignalSettings
from stats_stream.signals import (
    ScaleState,
    decide_replicas,
    hot_adapters,
    raw_demand,
    slo_breaches,
    thrashing,
)

S = SignalSettings(window_s=60, min_replicas=1, max_replicas=10, scale_down_windows=3, max_scale_down_step=1)


def load(queue: float = 0, tokens: float = 0, serving: int = 2) -> FleetLoad:
    return FleetLoad(
        serving_replicas=serving, billed_replicas=serving, queue_depth=queue, tokens_in_flight=tokens
    )


def test_a_tenant_over_the_ttft_target_is_alerted_and_one_under_is_not() -> None:
    out = slo_breaches([TenantLatency("acme", 50, 0.4, 1.3), TenantLatency("globex", 50, 0.2, 0.9)], S)
    assert [(a.subject, a.kind, a.severity) for a in out] == [("acme", "slo_ttft", "warning")]
    assert out[0].value == 1.3 and out[0].threshold == 1.0


def test_the_ttft_target_is_configurable_and_far_over_is_critical() -> None:
    out = slo_breaches([TenantLatency("acme", 50, 0.1, 0.5)], S.model_copy(update={"slo_ttft_s": 0.25}))
    assert out[0].severity == "critical"


def test_too_few_requests_never_alert() -> None:
    assert slo_breaches([TenantLatency("acme", 4, 3.0, 3.0)], S) == []


def test_a_replica_evicting_past_the_line_is_thrashing() -> None:
    churn = [ReplicaChurn("rep-1", 40, 40, 40.0, 40.0), ReplicaChurn("rep-2", 5, 30, 5.0, 30.0)]
    out = thrashing(churn, S)
    assert [a.subject for a in out] == ["rep-1"]
    assert thrashing(churn, S.model_copy(update={"thrash_evictions_per_min": 10})) != []


def test_hot_adapter_owner_count_is_ceil_of_load_over_capacity_capped_by_fleet() -> None:
    adapters = {
        "big": AdapterWindow("big", 100, 0, 2000.0, 1.0),
        "warm": AdapterWindow("warm", 10, 0, 700.0, 1.0),
        "cold": AdapterWindow("cold", 1, 0, 10.0, 1.0),
        "huge": AdapterWindow("huge", 100, 0, 64000.0, 1.0),
    }
    out = hot_adapters(adapters, fleet_size=26, settings=S)
    assert [(h.adapter_id, h.owners) for h in out] == [("huge", 26), ("big", 4), ("warm", 2)]


def test_raw_demand_is_the_largest_per_replica_quotient_within_bounds() -> None:
    assert raw_demand(load(queue=21), S) == 5
    assert raw_demand(load(tokens=16384 * 3 + 1), S) == 4
    assert raw_demand(load(), S) == 1
    assert raw_demand(load(queue=1000), S) == 10


def test_a_thrashing_replica_asks_for_one_more_replica_but_not_while_one_is_joining() -> None:
    assert raw_demand(load(serving=3), S, thrashing=1) == 4
    assert raw_demand(load(serving=3), S, thrashing=2) == 4  # one per window, however many thrash
    joining = FleetLoad(
        serving_replicas=4, billed_replicas=4, queue_depth=0, tokens_in_flight=0, joining_replicas=1
    )
    assert raw_demand(joining, S, thrashing=1) == 1  # the new replica has not taken its share yet
    assert raw_demand(load(serving=10), S, thrashing=1) == 10  # never past max_replicas
    d = decide_replicas(load(serving=3), ScaleState(previous=3, recent=(3, 3)), S, thrashing=1)
    assert d.desired == 4 and "thrashing=1" in d.reason


def test_scaling_up_happens_in_one_window() -> None:
    d = decide_replicas(load(queue=40), ScaleState(previous=2, recent=(2, 2)), S)
    assert d.desired == 8 and d.reason.startswith("scale up")


def test_scaling_down_waits_for_enough_quiet_windows_then_steps_down_one_at_a_time() -> None:
    state = ScaleState(previous=8)
    desired = []
    for _ in range(6):
        d = decide_replicas(load(queue=0, serving=8), state, S)
        state = d.state
        desired.append(d.desired)
    assert desired == [8, 8, 7, 6, 5, 4]


def test_a_brief_dip_does_not_scale_down() -> None:
    state = ScaleState(previous=4)
    desired = []
    for queue in [20, 0, 0, 20, 0, 0]:
        d = decide_replicas(load(queue=queue), state, S)
        state = d.state
        desired.append(d.desired)
    assert desired == [4, 4, 4, 4, 4, 4]


def test_the_first_window_starts_from_the_fleet_that_is_serving() -> None:
    d = decide_replicas(load(queue=0, serving=6), ScaleState(), S)
    assert d.desired == 6 and d.reason.startswith("hold")


def test_scale_state_round_trips_through_json() -> None:
    s = ScaleState(previous=3, recent=(1, 2, 3))
    assert ScaleState.from_json(s.to_json()) == s
    assert ScaleState.from_json(None) == ScaleState()


@pytest.mark.parametrize("bad", [{"min_replicas": -1}, {"queue_per_replica": 0}])
def test_signal_settings_reject_nonsense(bad: dict) -> None:
    with pytest.raises(ValueError):
        SignalSettings(**bad)
