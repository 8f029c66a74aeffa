"""Merged replicas, pure: when an adapter version gets a dedicated merged replica and when it loses it.

An adapter is promoted (desired 1) once its own traffic is over promote_tokens_per_s for promote_windows
consecutive windows, and demoted (desired 0) once it is under demote_tokens_per_s for demote_windows
consecutive windows. Windows in between keep the decision (hysteresis). A window no newer than the last one
counted changes nothing, so a replayed or reordered adapter.stats cannot count twice. Windows that never
arrived (the stats stream emits none for an adapter without traffic) count as under the demote threshold:
one for each window length that passed, beyond one window's grace, since a window was last counted (by the
worker's clock, not the window's start: a stream that is behind still delivers windows, a silent adapter
none), so a tenant whose traffic stops is demoted too.
A retired version (no alias points at it any more) is demoted at once and never promoted.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from schemas.events import MergeReason


@dataclass(frozen=True)
class MergePolicy:
    promote_tokens_per_s: float = 640.0  # one replica's capacity: past it the adapter fills a replica
    demote_tokens_per_s: float = 320.0
    promote_windows: int = 3
    demote_windows: int = 3


@dataclass(frozen=True)
class MergeState:
    """One adapter version's decision and the streaks it rests on (a merged_targets row)."""

    desired_replicas: int = 0
    above: int = 0  # consecutive counted windows over the promote threshold
    below: int = 0  # consecutive counted windows under the demote threshold
    last_window_start: datetime | None = None
    window_seconds: float | None = None
    tokens_per_s: float = 0.0
    reason: MergeReason | None = None
    seen_at: datetime | None = None  # when a window was last counted or the decision last changed


def observe(
    state: MergeState,
    window_start: datetime,
    window_seconds: float,
    tokens_per_s: float,
    policy: MergePolicy,
    now: datetime,
    retired: bool = False,
) -> MergeState:
    """The state after one closed traffic window of this adapter, counted at `now`."""
    if state.last_window_start is not None and window_start <= state.last_window_start:
        return state
    above = state.above + 1 if tokens_per_s > policy.promote_tokens_per_s else 0
    below = state.below + 1 if tokens_per_s < policy.demote_tokens_per_s else 0
    new = replace(
        state,
        above=above,
        below=below,
        last_window_start=window_start,
        window_seconds=window_seconds,
        tokens_per_s=tokens_per_s,
        seen_at=now,
    )
    return _decide(new, policy, retired)


def missed_windows(state: MergeState, now: datetime) -> int:
    """Windows that should have arrived since the last counted one and did not, after one window's grace."""
    if state.seen_at is None or state.window_seconds is None:
        return 0
    elapsed = (now - state.seen_at).total_seconds()
    return max(0, int(elapsed // state.window_seconds) - 1)


def silent(state: MergeState, now: datetime, policy: MergePolicy, retired: bool = False) -> MergeState:
    """The state of a merged adapter whose windows stopped coming: the missed ones count as quiet.

    Only a changed decision is returned as a new state; the streaks stay those of the windows seen, so a
    late window continues from them."""
    if state.desired_replicas == 0:
        return state
    if retired:
        return replace(state, desired_replicas=0, reason="retired", seen_at=now)
    if state.below + missed_windows(state, now) >= policy.demote_windows:
        return replace(state, desired_replicas=0, tokens_per_s=0.0, reason="demote", seen_at=now)
    return state


def moved_alias(previous: MergeState, target: MergeState, now: datetime) -> tuple[MergeState, MergeState]:
    """An alias moved from a merged version to another one: the old one is demoted at once and the new one
    is promoted at once, since the same traffic now resolves to it (it is served unmerged until its merged
    replica is ready). The new version's streaks start from zero, and its missed windows count from now, in
    the old version's window length while it has none of its own. A previous version already demoted as
    retired counts as merged: the alias row retires it before its aliases.changed event is handled."""
    if previous.desired_replicas == 0 and previous.reason != "retired":
        return previous, target
    old = replace(previous, desired_replicas=0, above=0, reason="alias_moved", seen_at=now)
    new = target
    if target.desired_replicas == 0:
        new = replace(target, desired_replicas=1, above=0, below=0, reason="alias_moved", seen_at=now)
        if new.window_seconds is None:
            new = replace(new, window_seconds=previous.window_seconds)
    return old, new


def _decide(state: MergeState, policy: MergePolicy, retired: bool) -> MergeState:
    if retired:
        return replace(state, desired_replicas=0, reason="retired") if state.desired_replicas else state
    if state.desired_replicas == 0 and state.above >= policy.promote_windows:
        return replace(state, desired_replicas=1, reason="promote")
    if state.desired_replicas > 0 and state.below >= policy.demote_windows:
        return replace(state, desired_replicas=0, reason="demote")
    return state
