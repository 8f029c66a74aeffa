"""The verdict of a churn run through the public gateway, each answer judged by its content.

Every tenant calls one alias that moves from an old canary version to a new one while traffic runs, and a
replica is killed mid-run. An answer is judged against the version the gateway admitted it for (its
x-adapter-id), which must be one of its alias's two versions:
- a complete answer carries that version's marker and no other (IsolationTally): a stream that mixes the
  two versions, carries another tenant's marker, or came from the base or no adapter (no marker) fails;
- a failed answer is a 503 or 504, or a stream ended by an error event, in OpenAI's error shape (never a
  500), only while the killed replica's requests end, and its partial text carries no foreign marker;
- no request sent before the move began is admitted for the new version, and staleness (the longest a
  request sent after the move was acknowledged still got the old version) stays within a bound.
Pure logic: plain values in, JSON-ready counts out.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from canary.check import IsolationTally
from canary.markers import Marker, markers_in_text

FAILURE_STATUSES = frozenset({503, 504})
_ERROR_KEYS = {"message", "type", "param", "code"}


@dataclass(frozen=True)
class AliasVersions:
    """One tenant's alias and the two canary versions it moves between."""

    alias: str
    old: str
    new: str


@dataclass(frozen=True)
class Answer:
    """One request as the client saw it (times on one monotonic clock)."""

    request_id: str
    alias: str
    sent: float
    ended: float
    status: int  # HTTP status; 0 when the connection itself failed
    adapter_id: str | None  # x-adapter-id
    text: str
    error: str  # a refusal's body or the stream's error event data; "" when the answer is complete

    @property
    def complete(self) -> bool:
        return self.status == 200 and not self.error


def openai_error_code(text: str) -> str | None:
    """The code of an OpenAI-shaped error body ({"error": {message, type, param, code}}); None otherwise."""
    try:
        body = json.loads(text)
    except ValueError:
        return None
    err = body.get("error") if isinstance(body, dict) and set(body) == {"error"} else None
    if not isinstance(err, dict) or set(err) != _ERROR_KEYS or not err["message"]:
        return None
    return str(err["code"])


def failure_kind(answer: Answer) -> str:
    """How a failed answer ended: "error_event", "503" or "504" in OpenAI's shape; else "bad:<status>"."""
    shaped = openai_error_code(answer.error) is not None
    if answer.status == 200:
        return "error_event" if shaped else "bad:event"
    if answer.status in FAILURE_STATUSES and shaped:
        return str(answer.status)
    return f"bad:{answer.status}"


@dataclass(frozen=True)
class RunEvents:
    """When the run moved the aliases and killed the replica."""

    flip_started: float
    flip_acked: dict[str, float]  # alias -> when its move was acknowledged
    killed_at: float | None
    kill_settle_s: float  # requests sent this long after the kill may still fail


@dataclass
class ChurnVerdict:
    """Counts over every answer of a run; ok() is the pass."""

    staleness_bound_s: float
    tally: IsolationTally = field(default_factory=IsolationTally)
    wrong_version: int = 0  # x-adapter-id is not one of the alias's versions
    early_new: int = 0  # sent before the move began, admitted for the new version
    new_after_flip: Counter[str] = field(default_factory=Counter)  # alias -> answers of the new version
    staleness_s: dict[str, float] = field(default_factory=dict)
    kill_outcomes: Counter[str] = field(default_factory=Counter)  # answers in flight at the kill, by end
    failures: Counter[str] = field(default_factory=Counter)  # every failed answer by kind
    failures_outside_kill: int = 0
    partial_leaks: int = 0  # a failed stream's partial text carries another adapter's marker
    served_after_kill: int = 0  # complete answers sent after the kill had settled (by the survivors)
    findings: list[dict[str, object]] = field(default_factory=list)

    def ok(self) -> bool:
        t = self.tally
        clean = not (t.wrong_marker or t.missing_marker or t.errors or self.wrong_version or self.early_new)
        failures_ok = not (self.failures_outside_kill or self.partial_leaks) and not any(
            k.startswith("bad:") for k in self.failures
        )
        fresh = all(self.new_after_flip[a] > 0 for a in self.staleness_s) and all(
            s <= self.staleness_bound_s for s in self.staleness_s.values()
        )
        return clean and failures_ok and fresh and t.adapter_requests > 0

    def summary(self) -> dict[str, object]:
        t = self.tally.summary()
        return {
            "answers": self.tally.requests + sum(self.failures.values()),
            "complete": t["adapter_requests"],
            "wrong_marker": t["wrong_marker"],
            "missing_marker": t["missing_marker"],
            "wrong_version": self.wrong_version,
            "early_new": self.early_new,
            "new_after_flip": dict(self.new_after_flip),
            "staleness_s": {a: round(s, 3) for a, s in self.staleness_s.items()},
            "staleness_bound_s": self.staleness_bound_s,
            "kill_outcomes": dict(self.kill_outcomes),
            "failures": dict(self.failures),
            "failures_outside_kill": self.failures_outside_kill,
            "partial_leaks": self.partial_leaks,
            "served_after_kill": self.served_after_kill,
            "ok": self.ok(),
            "findings": (t["findings"] if isinstance(t["findings"], list) else []) + self.findings[:20],
        }


def _staleness(answers: Iterable[Answer], v: AliasVersions, acked: float) -> float:
    late = [
        a.sent - acked for a in answers if a.alias == v.alias and a.adapter_id == v.old and a.sent >= acked
    ]
    return max(late, default=0.0)


def judge_run(
    answers: Sequence[Answer],
    versions: Sequence[AliasVersions],
    markers: Sequence[Marker],
    events: RunEvents,
    staleness_bound_s: float,
) -> ChurnVerdict:
    """Judge every answer of a run (see the module doc)."""
    by_alias = {v.alias: v for v in versions}
    verdict = ChurnVerdict(staleness_bound_s)
    kill = events.killed_at
    for a in answers:
        v = by_alias[a.alias]
        in_kill = kill is not None and a.ended >= kill and a.sent <= kill + events.kill_settle_s
        in_flight = kill is not None and a.sent <= kill <= a.ended
        found = markers_in_text(a.text, markers)
        if a.sent < events.flip_started and a.adapter_id == v.new:
            verdict.early_new += 1
        if a.adapter_id == v.new and a.sent >= events.flip_acked.get(v.alias, float("inf")):
            verdict.new_after_flip[v.alias] += 1
        if not a.complete:
            kind = failure_kind(a)
            verdict.failures[kind] += 1
            if in_flight:
                verdict.kill_outcomes[kind] += 1
            if not in_kill:
                verdict.failures_outside_kill += 1
            if found - {a.adapter_id}:
                verdict.partial_leaks += 1
            if kind.startswith("bad:") or not in_kill or found - {a.adapter_id}:
                verdict.findings.append({"request_id": a.request_id, "kind": kind, "error": a.error[:200]})
            continue
        if a.adapter_id not in (v.old, v.new):
            verdict.wrong_version += 1
            verdict.findings.append(
                {"request_id": a.request_id, "kind": "wrong_version", "got": a.adapter_id}
            )
            continue
        verdict.tally.record(a.request_id, a.adapter_id, found)
        if in_flight:
            verdict.kill_outcomes["ok"] += 1
        elif kill is not None and a.sent > kill + events.kill_settle_s:
            verdict.served_after_kill += 1
    verdict.staleness_s = {
        alias: _staleness(answers, by_alias[alias], acked) for alias, acked in events.flip_acked.items()
    }
    return verdict
