"""The gateway churn verdict fails on every kind of bad answer: a foreign or mixed marker, a base answer,
a version the alias never had, a stale admission, a 500 or an unshaped error, a failure outside the kill."""

from __future__ import annotations

import json
from typing import Any

from canary.churn_verdict import AliasVersions, Answer, RunEvents, failure_kind, judge_run
from canary.markers import Marker

A = AliasVersions("t0/marker:churn", "c0", "c1")
B = AliasVersions("t1/marker:churn", "c2", "c3")
MARKERS = [Marker(f"c{i}", f"ZQX-000{i}-KV", ()) for i in range(4)]
TEXT = {m.adapter_id: f" {m.text}" for m in MARKERS}
FLIP, ACK, KILL = 10.0, 10.5, 20.0
EVENTS = RunEvents(FLIP, {A.alias: ACK, B.alias: ACK}, KILL, kill_settle_s=5.0)
ERROR = json.dumps({"error": {"message": "replica lost", "type": "server_error", "param": None, "code": "x"}})


def _ok(alias: AliasVersions, adapter: str, sent: float, text: str | None = None) -> Answer:
    return Answer(
        f"r{sent}", alias.alias, sent, sent + 0.5, 200, adapter, TEXT[adapter] if text is None else text, ""
    )


def _clean() -> list[Answer]:
    """Old versions before the move, new ones after, answers on both sides of the kill."""
    return [
        _ok(A, "c0", 1.0),
        _ok(B, "c2", 2.0),
        _ok(A, "c0", 10.2),  # sent after the move began, before it was acknowledged: either version
        _ok(A, "c0", 10.6),  # 0.1 s stale
        _ok(A, "c1", 11.0),
        _ok(B, "c3", 11.0),
        _ok(B, "c3", 30.0),
        Answer("k", A.alias, 19.0, 20.3, 503, None, "", ERROR),
        Answer("e", B.alias, 19.5, 20.1, 200, "c3", " ZQX-", ERROR),
        Answer(
            "s", B.alias, 21.0, 21.5, 504, None, "", ERROR
        ),  # sent to the dead replica before it was seen dead
    ]


def _judge(answers: list[Answer], bound: float = 1.0) -> dict[str, Any]:
    return judge_run(answers, [A, B], MARKERS, EVENTS, bound).summary()


def test_a_clean_run_passes_and_reports_staleness_and_the_kill_outcomes() -> None:
    s = _judge(_clean())
    assert s["ok"], s
    assert s["staleness_s"] == {A.alias: 0.1, B.alias: 0.0}
    assert s["kill_outcomes"] == {"503": 1, "error_event": 1} and s["served_after_kill"] == 1
    assert s["failures"] == {"503": 1, "504": 1, "error_event": 1} and s["failures_outside_kill"] == 0
    assert s["new_after_flip"] == {A.alias: 1, B.alias: 3}  # the cut stream was admitted too


def test_another_tenants_marker_fails() -> None:
    s = _judge([*_clean(), _ok(A, "c0", 3.0, TEXT["c2"])])
    assert s["wrong_marker"] == 1 and not s["ok"]


def test_a_stream_mixing_the_old_and_new_versions_fails() -> None:
    s = _judge([*_clean(), _ok(A, "c1", 12.0, TEXT["c0"] + TEXT["c1"])])
    assert s["wrong_marker"] == 1 and not s["ok"]


def test_content_of_the_other_version_than_the_header_fails() -> None:
    s = _judge([*_clean(), _ok(A, "c1", 12.0, TEXT["c0"])])
    assert s["wrong_marker"] == 1 and s["missing_marker"] == 1 and not s["ok"]


def test_a_base_model_answer_to_an_adapter_request_fails() -> None:
    s = _judge([*_clean(), _ok(A, "c1", 12.0, " Paris is the capital of France.")])
    assert s["missing_marker"] == 1 and not s["ok"]


def test_a_version_the_alias_never_had_fails() -> None:
    s = _judge([*_clean(), _ok(A, "c2", 12.0)])
    assert s["wrong_version"] == 1 and not s["ok"]


def test_the_new_version_before_the_move_began_fails() -> None:
    s = _judge([*_clean(), _ok(A, "c1", 5.0)])
    assert s["early_new"] == 1 and not s["ok"]


def test_an_old_version_admitted_past_the_staleness_bound_fails() -> None:
    s = _judge([*_clean(), _ok(B, "c2", ACK + 3.0)], bound=2.0)
    assert s["staleness_s"][B.alias] == 3.0 and not s["ok"]


def test_a_500_or_an_unshaped_error_fails_even_during_the_kill() -> None:
    assert not _judge([*_clean(), Answer("x", A.alias, 19.5, 20.2, 500, None, "", ERROR)])["ok"]
    unshaped = Answer("y", A.alias, 19.5, 20.2, 200, "c1", "", "replica lost")
    assert failure_kind(unshaped) == "bad:event"
    assert not _judge([*_clean(), unshaped])["ok"]


def test_a_well_shaped_failure_outside_the_kill_fails() -> None:
    s = _judge([*_clean(), Answer("z", A.alias, 12.0, 12.4, 503, None, "", ERROR)])
    assert s["failures_outside_kill"] == 1 and not s["ok"]


def test_a_cut_stream_carrying_another_tenants_marker_fails() -> None:
    s = _judge([*_clean(), Answer("w", A.alias, 19.5, 20.2, 200, "c1", TEXT["c2"], ERROR)])
    assert s["partial_leaks"] == 1 and not s["ok"]
