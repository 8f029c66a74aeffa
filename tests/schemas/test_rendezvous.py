"""Rendezvous owner selection: k owners, stable, and a membership change moves only about 1/N placements."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.rendezvous import owners, ranked, score

REPLICAS = [f"r{i}" for i in range(26)]
ADAPTERS = [f"acme-support-v{i}" for i in range(2000)]

ids = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=20)


def test_score_is_a_fixed_function_of_the_pair() -> None:
    # Pinned value: a change of hash function would silently re-shuffle every placement in the fleet.
    assert score("a", "r1") == score("a", "r1")
    assert score("a", "r1") != score("r1", "a")
    assert score("acme-v1", "replica-0") == 0x38ADDD93EE215730


def test_owners_returns_k_distinct_replicas_in_rank_order() -> None:
    got = owners("acme-v1", REPLICAS, 3)
    assert len(got) == len(set(got)) == 3
    assert got == ranked("acme-v1", REPLICAS)[:3]


def test_owners_is_capped_by_fleet_size() -> None:
    assert sorted(owners("acme-v1", ["a", "b"], 5)) == ["a", "b"]


def test_owners_do_not_depend_on_input_order() -> None:
    assert owners("x", REPLICAS, 2) == owners("x", list(reversed(REPLICAS)), 2)


def test_owners_spread_evenly_over_the_fleet() -> None:
    counts = dict.fromkeys(REPLICAS, 0)
    for a in ADAPTERS:
        for r in owners(a, REPLICAS, 2):
            counts[r] += 1
    mean = 2 * len(ADAPTERS) / len(REPLICAS)
    assert min(counts.values()) > 0.6 * mean and max(counts.values()) < 1.4 * mean


def _moved(before: list[str], after: list[str], k: int) -> int:
    moved = 0
    for a in ADAPTERS:
        moved += len(set(owners(a, after, k)) - set(owners(a, before, k)))
    return moved


def test_adding_a_replica_moves_about_one_in_n_placements() -> None:
    k, n = 2, len(REPLICAS) + 1
    moved = _moved(REPLICAS, [*REPLICAS, "r-new"], k)
    expected = k * len(ADAPTERS) / n
    assert 0.7 * expected < moved < 1.3 * expected
    # every moved placement went to the new replica
    for a in ADAPTERS[:200]:
        assert set(owners(a, [*REPLICAS, "r-new"], k)) - set(owners(a, REPLICAS, k)) <= {"r-new"}


@settings(max_examples=60, deadline=None)
@given(
    adapter=ids,
    replicas=st.sets(ids, min_size=2, max_size=30),
    k=st.integers(min_value=1, max_value=4),
    data=st.data(),
)
def test_removing_a_replica_only_replaces_its_own_placements(adapter, replicas, k, data) -> None:
    fleet = sorted(replicas)
    gone = data.draw(st.sampled_from(fleet))
    before = owners(adapter, fleet, k)
    after = owners(adapter, [r for r in fleet if r != gone], k)
    # Owners that stay alive keep the adapter; at most one new owner replaces the one that left.
    assert set(before) - {gone} <= set(after)
    assert len(set(after) - set(before)) <= (1 if gone in before else 0)


@settings(max_examples=60, deadline=None)
@given(adapter=ids, replicas=st.sets(ids, min_size=1, max_size=30), new=ids, k=st.integers(1, 4))
def test_joining_replica_only_takes_placements_it_wins(adapter, replicas, new, k) -> None:
    fleet = sorted(replicas - {new})
    if not fleet:
        return
    before, after = set(owners(adapter, fleet, k)), set(owners(adapter, [*fleet, new], k))
    assert after - before <= {new}
    assert len(before - after) <= 1
