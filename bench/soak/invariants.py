"""The fault soak's invariants over what it recorded (facts.py): each a name, pass or fail, violations.

1. registrations: every registration reached exactly one final state (ready or rejected), with exactly one
   adapters.validated outbox row, and none is left pending;
2. aliases: the gateway serves, at the end, what the last acknowledged move of each alias named (its
   x-adapter-id and its canary marker);
3. usage: after deduplication by event_id, every chat the client saw stream (200) has exactly one
   requests.completed event, a refused chat at most one, and no event names a request the client never
   saw answered; a request with two distinct event_ids counts twice;
4. versions: no answer carries a marker other than that of the version its x-adapter-id names, no complete
   answer lacks it, and every x-adapter-id is one of its alias's versions;
5. release: every slot pin, refcount, engine row, KV block and Redis reservation is released at the end.
Pure logic: plain values in, violation strings out.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from bench.soak.facts import Chat, Facts
from canary.churn_verdict import openai_error_code

MAX_LISTED = 20  # violations listed per invariant; the count is always whole

MarkerReader = Callable[[str], set[str]]  # an answer's text -> the adapter ids whose markers it carries


@dataclass
class Result:
    name: str
    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def to_json(self) -> dict[str, object]:
        return {
            "pass": self.ok,
            "violations": len(self.violations),
            "listed": self.violations[:MAX_LISTED],
        }


def registrations(facts: Facts) -> Result:
    out = Result("registrations_settle_once")
    for r in facts.registrations:
        if r.final_status is None and not r.acked:
            continue  # never acknowledged and never stored: nothing to settle
        if r.final_status == "pending":
            out.violations.append(f"{r.adapter_id}: still pending")
        elif r.final_status not in ("ready", "rejected"):
            out.violations.append(f"{r.adapter_id}: acknowledged, final state {r.final_status}")
        elif r.validated_rows != 1:
            out.violations.append(f"{r.adapter_id}: {r.validated_rows} adapters.validated outbox rows")
    return out


def aliases(facts: Facts, markers_in: MarkerReader) -> Result:
    out = Result("aliases_serve_last_acked_move")
    expected = facts.expected_aliases()
    finals = {c.alias: c for c in facts.chats if c.final}
    for alias, adapter_id in sorted(expected.items()):
        chat = finals.get(alias)
        if chat is None:
            out.violations.append(f"{alias}: no final chat")
        elif not chat.complete:
            out.violations.append(f"{alias}: final chat failed: {chat.status} {chat.error[:120]}")
        elif chat.adapter_id != adapter_id:
            out.violations.append(f"{alias}: served {chat.adapter_id}, last acknowledged move {adapter_id}")
        elif markers_in(chat.text) != {adapter_id}:
            out.violations.append(f"{alias}: markers {sorted(markers_in(chat.text))}, expected {adapter_id}")
    return out


def usage(facts: Facts) -> Result:
    out = Result("usage_once_per_chat")
    ids_by_request: dict[str, set[str]] = defaultdict(set)
    for e in facts.usage:
        ids_by_request[e.request_id].add(e.event_id)
    seen: dict[str, Chat] = {}
    for c in facts.chats:
        if c.request_id is None:
            if c.status == 200:
                out.violations.append(f"a streamed chat ({c.alias}) without an x-request-id")
        elif c.request_id in seen:
            out.violations.append(f"{c.request_id}: the gateway gave this request id to two chats")
        else:
            seen[c.request_id] = c
    for request_id, chat in sorted(seen.items()):
        n = len(ids_by_request.get(request_id, ()))
        if chat.status == 200 and n != 1:
            out.violations.append(f"{request_id}: streamed ({chat.alias}), {n} usage events")
        elif chat.status != 200 and n > 1:
            out.violations.append(f"{request_id}: refused {chat.status}, {n} usage events")
    for request_id in sorted(set(ids_by_request) - set(seen)):
        out.violations.append(f"{request_id}: usage event for a request the client never saw answered")
    return out


def versions(facts: Facts, markers_in: MarkerReader) -> Result:
    out = Result("served_by_named_version")
    for c in facts.chats:
        if c.status != 200:
            continue
        label = f"{c.request_id} ({c.alias})"
        allowed = facts.versions.get(c.alias, ())
        if c.adapter_id not in allowed:
            out.violations.append(f"{label}: x-adapter-id {c.adapter_id} is none of {list(allowed)}")
            continue
        found = markers_in(c.text)
        if found - {c.adapter_id}:
            out.violations.append(f"{label}: named {c.adapter_id}, carries {sorted(found - {c.adapter_id})}")
        elif c.complete and found != {c.adapter_id}:
            out.violations.append(f"{label}: complete answer without {c.adapter_id}'s marker")
    return out


def release(facts: Facts) -> Result:
    out = Result("everything_released")
    r = facts.release
    if r is None:
        return Result(out.name, ["no release snapshot was taken"])
    out.violations.extend(f"{name}: not served, so not checked" for name in r.missing)
    for replica, held in sorted(r.replica_holds.items()):
        for name, value in sorted(held.items()):
            if value:
                out.violations.append(f"{replica}: {name} = {value:g}")
    for name, value in sorted(r.gateway_inflight.items()):
        if value:
            out.violations.append(f"gateway: {name} = {value:g}")
    for tenant, (reserves, refunds) in sorted(r.ledger.items()):
        if reserves != refunds:
            out.violations.append(f"{tenant}: {reserves} Redis reserves, {refunds} refunds")
    return out


def absent(samples: dict[str, float], names: tuple[str, ...]) -> list[str]:
    """The names (or label-less prefixes) no sample starts with: a metric not served can't show a hold."""
    return [n for n in names if not any(k.startswith(n) for k in samples)]


def check(facts: Facts, markers_in: MarkerReader) -> list[Result]:
    """Every invariant, in the order of the module doc."""
    return [
        registrations(facts),
        aliases(facts, markers_in),
        usage(facts),
        versions(facts, markers_in),
        release(facts),
    ]


def counts(facts: Facts) -> dict[str, object]:
    """The run's sizes for the summary."""
    unique = {e.event_id for e in facts.usage}
    return {
        "registrations": dict(Counter(str(r.final_status) for r in facts.registrations)),
        "registrations_unacknowledged": sum(not r.acked for r in facts.registrations),
        "alias_moves_acked": len(facts.moves),
        "chats": dict(Counter(_chat_outcome(c) for c in facts.chats)),
        "chat_failures": dict(Counter(_failure(c) for c in facts.chats if not c.complete).most_common(8)),
        "usage_events": len(facts.usage),
        "usage_duplicates_removed": len(facts.usage) - len(unique),
    }


def chats_between(chats: list[Chat], start: float, end: float) -> dict[str, int]:
    """Outcomes of the chats sent in [start, end) (time.monotonic()), by status and error code."""
    return dict(Counter("200" if c.complete else _failure(c) for c in chats if start <= c.sent_at < end))


def _failure(c: Chat) -> str:
    """A failed chat's status and OpenAI error code (or the client's exception)."""
    return f"{c.status}:{openai_error_code(c.error) or c.error.split(':', 1)[0][:40]}"


def _chat_outcome(c: Chat) -> str:
    if c.complete:
        return "200"
    return "200+error" if c.status == 200 else str(c.status)
