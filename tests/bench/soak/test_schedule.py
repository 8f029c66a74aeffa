"""The soak's schedule is a function of its seed and covers every fault kind."""

from __future__ import annotations

import pytest

from bench.soak.schedule import DOWN_S, FAULTS, build_schedule


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another() -> None:
    assert build_schedule(7, 600) == build_schedule(7, 600)
    assert build_schedule(7, 600) != build_schedule(8, 600)


def test_a_short_run_still_has_every_fault_once_in_time_order() -> None:
    faults = build_schedule(1, 10)
    assert sorted(f.kind for f in faults) == sorted(FAULTS)
    assert [f.at_s for f in faults] == sorted(f.at_s for f in faults)
    for f in faults:
        low, high = DOWN_S[f.kind]
        assert low <= f.down_s <= high


def test_a_longer_run_repeats_rounds_within_its_length() -> None:
    faults = build_schedule(3, 600, gap_s=(10.0, 20.0))
    assert len(faults) > len(FAULTS) and len(faults) % len(FAULTS) == 0
    assert faults[-1].at_s <= 600 + len(FAULTS) * 20


def test_an_unknown_fault_kind_is_refused() -> None:
    with pytest.raises(ValueError):
        build_schedule(1, 10, kinds=("disk",))
