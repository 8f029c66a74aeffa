"""The per-tier load times: one table for every tier, and the router and the simulator both price with it."""

from __future__ import annotations

from typing import get_args

from gateway.public.routing.policy import RouterPolicy
from schemas.events import Tier
from schemas.tiers import LOAD_S
from sim.timing import TimingModel


def test_every_tier_has_a_load_time_and_a_farther_tier_is_slower() -> None:
    assert tuple(LOAD_S) == get_args(Tier)
    assert LOAD_S["gpu"] == 0.0
    times = [LOAD_S[tier] for tier in get_args(Tier)]
    assert times == sorted(times) and len(set(times)) == len(times)


def test_the_router_and_the_simulator_default_to_the_same_load_times() -> None:
    assert dict(RouterPolicy().load_s) == dict(LOAD_S) == TimingModel().load_s
