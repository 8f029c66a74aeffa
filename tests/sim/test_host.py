"""Replicas sharing one machine's compute: steps split it evenly and are re-timed as others start and end."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sim.host import SharedHost
from sim.replica import CacheSizes
from sim.simulator import SimConfig, simulate
from sim.timing import TimingModel
from sim.workload import Request


def current_ends(events: list[tuple[float, int, object]], host: SharedHost) -> dict[str, float]:
    """The latest-version end of each running step."""
    out = {}
    for t, _kind, (replica, version) in events:
        if replica in host.active and host.active[replica][1] == version:
            out[replica] = t
    return out


def test_processor_sharing_retimes_running_steps() -> None:
    events: list[tuple[float, int, object]] = []
    host = SharedHost(lambda t, kind, payload: events.append((t, kind, payload)), step_kind=1)
    host.start("a", 1.0, now=0.0)
    assert current_ends(events, host) == {"a": 1.0}  # alone: its solo time
    host.start("b", 3.0, now=0.0)
    assert current_ends(events, host) == {"a": 2.0, "b": 6.0}  # two share: both at half speed
    assert host.end("a", host.active["a"][1], now=2.0)
    assert current_ends(events, host) == {"b": pytest.approx(4.0)}  # 1 s of b done; 2 s left, alone
    assert not host.end("b", 1, now=6.0)  # b's first end was superseded


def test_partial_contention_slows_side_by_side_steps_less() -> None:
    events: list[tuple[float, int, object]] = []
    host = SharedHost(lambda t, kind, payload: events.append((t, kind, payload)), 1, contention=0.3)
    host.start("a", 1.0, now=0.0)
    host.start("b", 1.0, now=0.0)
    assert current_ends(events, host) == {"a": pytest.approx(1.3), "b": pytest.approx(1.3)}


def test_two_replicas_on_one_host_take_twice_as_long_side_by_side() -> None:
    trace = [Request(0, 0.0, "adapter-00000", 8, 3), Request(1, 0.0, "adapter-00001", 8, 3)]
    timing = replace(TimingModel(), load_s={"gpu": 0.0, "ram": 0.0, "disk": 0.0, "remote": 0.0})
    cfg = SimConfig(replicas=2, sizes=CacheSizes(gpu_slots=4), warmup_s=0.0, check_every=1)
    alone = simulate(cfg, timing, trace)
    shared = simulate(replace(cfg, host_contention=1.0), timing, trace)
    apart = simulate(replace(cfg, host_contention=0.0), timing, trace)
    assert {sr.replica_id for sr in alone.requests} == {"replica-000", "replica-001"}
    for a, s in zip(
        sorted(alone.requests, key=lambda r: r.req.request_id),
        sorted(shared.requests, key=lambda r: r.req.request_id),
        strict=True,
    ):
        assert s.first_token_s == pytest.approx(2 * a.first_token_s)
        assert s.finish_s == pytest.approx(2 * a.finish_s)
    assert [r.finish_s for r in apart.requests] == pytest.approx([r.finish_s for r in alone.requests])
