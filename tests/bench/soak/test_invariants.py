"""Each soak invariant passes on a clean run and fails on a crafted violation of it."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from bench.soak.facts import AliasMove, Chat, Facts, Registration, Release, UsageEvent
from bench.soak.invariants import absent, chats_between, check, counts

ALIAS = "t0/marker:soak"
OLD, NEW = "canary-old", "canary-new"
MARK = {OLD: "<<old>>", NEW: "<<new>>"}


def markers_in(text: str) -> set[str]:
    return {a for a, m in MARK.items() if m in text}


def chat(rid: str | None, adapter: str | None, status: int = 200, error: str = "", **kw: object) -> Chat:
    text = f"hi {MARK[adapter]}" if adapter and status == 200 and not error else ""
    return Chat(ALIAS, status, rid, adapter, text, error, **kw)  # type: ignore[arg-type]


def clean() -> Facts:
    return Facts(
        registrations=[Registration("r1", True, "ready", 1), Registration("r2", True, "rejected", 1)],
        initial_aliases={ALIAS: OLD},
        versions={ALIAS: (OLD, NEW)},
        moves=[AliasMove(ALIAS, NEW, 5.0), AliasMove(ALIAS, OLD, 9.0)],
        chats=[
            chat("req_1", OLD),
            chat("req_2", NEW),
            chat("req_3", None, status=503, error='{"error": {}}'),
            chat(None, None, status=0, error="ConnectError"),
            chat("req_4", OLD, final=True),
        ],
        # req_1 sent twice (at-least-once): one event after dedupe; req_3's refusal published one
        usage=[
            UsageEvent("e1", "req_1"),
            UsageEvent("e1", "req_1"),
            UsageEvent("e2", "req_2"),
            UsageEvent("e3", "req_3"),
            UsageEvent("e4", "req_4"),
        ],
        release=Release({"rep-a": {"holds{kind=pin}": 0.0}}, {"inflight": 0.0}, {"t0": (5, 5)}),
    )


def failed(facts: Facts) -> dict[str, list[str]]:
    return {r.name: r.violations for r in check(facts, markers_in) if not r.ok}


def test_a_clean_run_passes_every_invariant_and_counts_duplicates() -> None:
    facts = clean()
    assert failed(facts) == {}
    assert counts(facts)["usage_duplicates_removed"] == 1


@pytest.mark.parametrize(
    "registration",
    [
        Registration("r3", True, "pending", 0),
        Registration("r3", True, None, 0),
        Registration("r3", True, "ready", 2),
        Registration("r3", True, "rejected", 0),
        Registration("r3", False, "pending", 0),
        Registration("r3", False, "ready", 2),  # never acknowledged, but stored: it settles once all the same
    ],
)
def test_a_registration_not_settled_exactly_once_fails(registration: Registration) -> None:
    facts = clean()
    facts.registrations.append(registration)
    assert list(failed(facts)) == ["registrations_settle_once"]


def test_the_final_answer_must_be_the_last_acknowledged_move() -> None:
    facts = clean()
    facts.moves.append(AliasMove(ALIAS, NEW, 12.0))  # acknowledged last, but the gateway still serves OLD
    assert "aliases_serve_last_acked_move" in failed(facts)


def test_moves_count_in_acknowledgement_order_not_list_order() -> None:
    facts = clean()
    facts.moves = list(reversed(facts.moves))
    assert failed(facts) == {}


def test_a_final_answer_with_the_wrong_marker_fails_the_alias_check() -> None:
    facts = clean()
    facts.chats[-1] = replace(facts.chats[-1], text=f"hi {MARK[NEW]}")
    assert {"aliases_serve_last_acked_move", "served_by_named_version"} <= set(failed(facts))


def test_a_missing_final_chat_fails() -> None:
    facts = clean()
    facts.chats = [c for c in facts.chats if not c.final]
    facts.usage = [e for e in facts.usage if e.request_id != "req_4"]
    assert list(failed(facts)) == ["aliases_serve_last_acked_move"]


@pytest.mark.parametrize(
    "usage",
    [
        [e for e in clean().usage if e.request_id != "req_2"],  # a streamed chat lost its event
        [*clean().usage, UsageEvent("e9", "req_2")],  # a second event id for one request
        [*clean().usage, UsageEvent("e8", "req_3")],  # a refusal counted twice
        [*clean().usage, UsageEvent("e7", "req_999")],  # a request the client never saw
    ],
)
def test_usage_not_exactly_once_per_chat_fails(usage: list[UsageEvent]) -> None:
    facts = clean()
    facts.usage = usage
    assert list(failed(facts)) == ["usage_once_per_chat"]


@pytest.mark.parametrize(
    "extra",
    [
        chat(None, OLD),  # streamed, but no x-request-id: its usage event can't be checked
        chat("req_1", OLD),  # one request id given to two chats
    ],
)
def test_a_streamed_chat_the_usage_check_cannot_place_fails(extra: Chat) -> None:
    facts = clean()
    facts.chats.append(extra)
    assert list(failed(facts)) == ["usage_once_per_chat"]


def test_an_unacknowledged_registration_that_was_never_stored_passes() -> None:
    facts = clean()
    facts.registrations.append(Registration("r4", False, None, 0))
    assert failed(facts) == {}


def test_release_fails_on_a_metric_not_served_and_absent_finds_it() -> None:
    facts = clean()
    facts.release = Release({"rep-a": {}}, {}, {"t0": (5, 5)}, ["rep-a vllm:kv_cache_usage_perc"])
    assert list(failed(facts)) == ["everything_released"]
    served = {"lorafleet_replica_holds{kind=pin}": 0.0, "vllm:num_requests_running": 0.0}
    wanted = ("lorafleet_replica_holds", "vllm:num_requests_running", "vllm:kv_cache_usage_perc")
    assert absent(served, wanted) == ["vllm:kv_cache_usage_perc"]


@pytest.mark.parametrize(
    "bad",
    [
        Chat(ALIAS, 200, "req_5", OLD, f"{MARK[OLD]} {MARK[NEW]}", ""),  # a mix of versions
        Chat(ALIAS, 200, "req_5", OLD, f"{MARK[NEW]}", ""),  # the other version's answer
        Chat(ALIAS, 200, "req_5", OLD, "no marker at all", ""),  # the base's answer
        Chat(ALIAS, 200, "req_5", "someone-else", "", ""),  # not one of the alias's versions
        Chat(ALIAS, 200, "req_5", OLD, f"{MARK[NEW]}", '{"error": {}}'),  # a broken stream's partial leak
    ],
)
def test_an_answer_not_from_its_named_version_fails(bad: Chat) -> None:
    facts = clean()
    facts.chats.append(bad)
    facts.usage.append(UsageEvent("e5", "req_5"))
    assert list(failed(facts)) == ["served_by_named_version"]


def test_a_partial_answer_of_its_own_version_passes() -> None:
    facts = clean()
    facts.chats.append(Chat(ALIAS, 200, "req_5", OLD, "hi <<ol", '{"error": {}}'))
    facts.usage.append(UsageEvent("e5", "req_5"))
    assert failed(facts) == {}


@pytest.mark.parametrize(
    "release",
    [
        Release({"rep-a": {"holds{kind=pin}": 1.0}}, {"inflight": 0.0}, {"t0": (5, 5)}),
        Release({"rep-a": {}}, {"inflight": 16.0}, {"t0": (5, 5)}),
        Release({"rep-a": {}}, {"inflight": 0.0}, {"t0": (6, 5)}),
        None,
    ],
)
def test_anything_still_held_at_the_end_fails(release: Release | None) -> None:
    facts = clean()
    facts.release = release
    assert list(failed(facts)) == ["everything_released"]


REFUSAL = {
    "message": "try again",
    "type": "service_unavailable",
    "param": None,
    "code": "control_plane_unavailable",
}


def test_chats_are_counted_in_the_fault_window_they_were_sent_in() -> None:
    sent = [
        Chat("a/x:prod", 200, "r1", "v1", "ok", "", sent_at=9.9),
        Chat("a/x:prod", 200, "r2", "v1", "ok", "", sent_at=10.0),
        Chat("a/x:prod", 503, "r3", None, "", json.dumps({"error": REFUSAL}), sent_at=12.0),
        Chat("a/x:prod", 200, "r4", "v1", "ok", "", sent_at=20.0),
    ]
    assert chats_between(sent, 10.0, 20.0) == {"200": 1, "503:control_plane_unavailable": 1}
