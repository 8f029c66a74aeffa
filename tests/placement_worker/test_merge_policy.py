from __future__ import annotations

from datetime import UTC, datetime, timedelta

from placement_worker.merge_policy import MergePolicy, MergeState, moved_alias, observe, silent

POLICY = MergePolicy(promote_tokens_per_s=640, demote_tokens_per_s=320, promote_windows=3, demote_windows=2)
T0 = datetime(2026, 1, 1, tzinfo=UTC)
WS = 10.0
LAG = timedelta(seconds=25)  # windows arrive well after their start (a stream catching up)


def at(i: float) -> datetime:
    return T0 + timedelta(seconds=WS * i)


def windows(state: MergeState, rates: list[float], start: int = 0, retired: bool = False) -> MergeState:
    for i, tps in enumerate(rates, start):
        state = observe(state, at(i), WS, tps, POLICY, at(i) + LAG, retired)
    return state


def test_an_adapter_over_capacity_for_n_consecutive_windows_is_promoted() -> None:
    assert windows(MergeState(), [700, 700]).desired_replicas == 0
    promoted = windows(MergeState(), [700, 700, 700])
    assert (promoted.desired_replicas, promoted.reason, promoted.tokens_per_s) == (1, "promote", 700)


def test_a_window_under_the_threshold_restarts_the_promotion_streak() -> None:
    assert windows(MergeState(), [700, 700, 600, 700, 700]).desired_replicas == 0
    assert windows(MergeState(), [700, 700, 600, 700, 700, 700]).desired_replicas == 1


def test_demotion_needs_m_windows_under_the_lower_threshold_and_between_keeps_the_merge() -> None:
    merged = windows(MergeState(), [700, 700, 700])
    assert windows(merged, [500, 400, 600, 500], start=3).desired_replicas == 1  # between the thresholds
    assert windows(merged, [300], start=3).desired_replicas == 1
    demoted = windows(merged, [300, 100], start=3)
    assert (demoted.desired_replicas, demoted.reason) == (0, "demote")


def test_a_replayed_or_older_window_counts_once() -> None:
    state = windows(MergeState(), [700, 700])
    again = observe(state, at(1), WS, 700, POLICY, at(5))
    assert again == state
    assert windows(state, [700], start=2).desired_replicas == 1


def test_windows_that_stop_coming_count_as_quiet_after_a_grace_window() -> None:
    merged = windows(MergeState(), [700, 700, 700])  # the last one counted at at(2) + LAG
    seen = at(2) + LAG
    assert silent(merged, seen + timedelta(seconds=2.9 * WS), POLICY) == merged  # one missed window
    demoted = silent(merged, seen + timedelta(seconds=3 * WS), POLICY)  # two missed windows
    assert (demoted.desired_replicas, demoted.reason, demoted.above) == (0, "demote", merged.above)
    assert silent(MergeState(), seen + timedelta(hours=1), POLICY) == MergeState()


def test_late_windows_of_a_stream_that_is_behind_are_not_silence() -> None:
    merged = windows(MergeState(), [700, 700, 700])
    late = timedelta(minutes=5)  # every window arrives five minutes after its start, one per window
    state = observe(merged, at(3), WS, 700, POLICY, at(3) + late)
    assert silent(state, at(3) + late + timedelta(seconds=WS), POLICY).desired_replicas == 1


def test_a_retired_version_is_demoted_at_once_and_never_promoted() -> None:
    merged = windows(MergeState(), [700, 700, 700])
    assert silent(merged, at(2) + LAG, POLICY, retired=True).reason == "retired"
    assert windows(merged, [900], start=3, retired=True).desired_replicas == 0
    assert windows(MergeState(), [900] * 5, retired=True).desired_replicas == 0


def test_an_alias_move_hands_the_merge_to_the_new_version_at_once() -> None:
    old = windows(MergeState(), [700, 700, 700])
    old_after, new_after = moved_alias(old, MergeState(), at(3))
    assert (old_after.desired_replicas, old_after.reason) == (0, "alias_moved")
    assert (new_after.desired_replicas, new_after.reason) == (1, "alias_moved")
    unmerged = windows(MergeState(), [700])
    assert moved_alias(unmerged, MergeState(), at(3)) == (unmerged, MergeState())


def test_the_new_version_loses_its_merge_when_its_own_traffic_stays_low() -> None:
    _, new = moved_alias(windows(MergeState(), [700, 700, 700]), MergeState(), at(3))
    assert windows(new, [100, 100], start=5).desired_replicas == 0


def test_a_new_version_that_never_gets_traffic_is_demoted_by_silence() -> None:
    _, new = moved_alias(windows(MergeState(), [700, 700, 700]), MergeState(), at(3))
    assert silent(new, at(3) + timedelta(seconds=2.9 * WS), POLICY).desired_replicas == 1
    assert silent(new, at(3) + timedelta(seconds=3 * WS), POLICY).desired_replicas == 0


def test_the_handoff_holds_when_the_retirement_was_seen_before_the_alias_event() -> None:
    merged = windows(MergeState(), [700, 700, 700])
    retired = silent(merged, at(3), POLICY, retired=True)
    old, new = moved_alias(retired, MergeState(), at(3))
    assert (old.desired_replicas, new.desired_replicas, new.reason) == (0, 1, "alias_moved")
    demoted = windows(MergeState(), [700, 700, 700, 100, 100])
    assert moved_alias(demoted, MergeState(), at(6)) == (demoted, MergeState())
