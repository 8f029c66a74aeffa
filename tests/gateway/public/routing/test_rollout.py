"""The weighted split of an alias between its version and its canary: sticky, and close to the weight."""

from __future__ import annotations

import math

import pytest

from gateway.public.routing.rollout import AliasTarget, unit_hash


def test_without_a_canary_every_request_gets_the_version() -> None:
    assert {AliasTarget("v7").pick("acme/a:prod", f"req-{i}") for i in range(100)} == {"v7"}


@pytest.mark.parametrize("weight", [0.01, 0.1, 0.25, 0.5, 0.9])
def test_the_canary_share_is_its_weight_within_a_binomial_bound(weight: float) -> None:
    n = 20_000
    target = AliasTarget("v7", "v8", weight)
    canary = sum(target.pick("acme/a:prod", f"chatcmpl-{i}") == "v8" for i in range(n))
    bound = 4 * math.sqrt(n * weight * (1 - weight))  # four standard deviations
    assert abs(canary - n * weight) <= bound, (canary, n * weight)


def test_a_key_is_sticky_and_raising_the_weight_only_moves_keys_onto_the_canary() -> None:
    keys = [f"user-{i}" for i in range(2_000)]
    low, high = AliasTarget("v7", "v8", 0.1), AliasTarget("v7", "v8", 0.3)
    assert [low.pick("acme/a:prod", k) for k in keys] == [low.pick("acme/a:prod", k) for k in keys]
    on_low = {k for k in keys if low.pick("acme/a:prod", k) == "v8"}
    on_high = {k for k in keys if high.pick("acme/a:prod", k) == "v8"}
    assert on_low < on_high  # a user on the canary stays there as the rollout widens


def test_the_hash_is_fixed_across_processes_and_depends_on_the_alias() -> None:
    # pinned: every gateway process (any PYTHONHASHSEED, any release) sends user-1 to the same version
    assert unit_hash("acme/a:prod", "user-1") == 0.7331361937502132
    assert unit_hash("acme/a:prod", "user-1") != unit_hash("acme/b:prod", "user-1")
    assert unit_hash("a", "bc") != unit_hash("ab", "c")  # the separator keeps fields apart
