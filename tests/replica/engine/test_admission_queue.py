"""The admission queues on plain values: FIFO order, and the fair queue's properties (no starvation,
work-conserving, the per-tenant row cap, bounded service difference) over random arrivals."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from replica.engine.admission_queue import FairQueue, FifoQueue, make_queue


@dataclass(eq=False)
class Req:
    tenant: str | None
    cost: int
    name: str = ""


def _always(_: Req) -> bool:
    return True


def test_fifo_serves_in_arrival_order_and_skips_what_does_not_fit() -> None:
    q: FifoQueue[Req] = FifoQueue()
    reqs = [Req("a", 5, "a1"), Req("b", 50, "b1"), Req("a", 5, "a2")]
    for r in reqs:
        q.push(r.tenant, r)
    assert q.pick({}, lambda r: r.cost < 10) is reqs[0]
    assert q.pick({}, lambda r: r.cost < 10) is reqs[2]
    assert q.pick({}, lambda r: r.cost < 10) is None and list(q) == [reqs[1]]


def test_fair_serves_the_tenant_with_least_service_not_the_burst() -> None:
    q: FairQueue[Req] = FairQueue(max_rows_per_tenant=100)
    burst = [Req("noisy", 10, f"n{i}") for i in range(10)]
    for r in burst:
        q.push(r.tenant, r)
    first = q.pick({}, _always)
    q.charge("noisy", 10)
    quiet = Req("quiet", 10, "q")
    q.push("quiet", quiet)  # joins at the least counter of those waiting: no banked credit
    assert first is burst[0]
    assert q.pick({}, _always) is burst[1]  # ties go by name; both at 10 now
    q.charge("noisy", 10)
    assert q.pick({}, _always) is quiet


def test_a_tenant_at_its_cap_waits_and_others_are_served() -> None:
    q: FairQueue[Req] = FairQueue(max_rows_per_tenant=2)
    a, b = Req("a", 1), Req("b", 1)
    q.push("a", a)
    q.push("b", b)
    assert q.pick({"a": 2}, _always) is b
    assert q.pick({"a": 2}, _always) is None and len(q) == 1
    assert q.pick({"a": 1}, _always) is a


def test_requests_without_a_tenant_are_never_capped() -> None:
    q: FairQueue[Req] = FairQueue(max_rows_per_tenant=1)
    r = Req(None, 1)
    q.push(None, r)
    assert q.pick({None: 50}, _always) is r


def test_make_queue_builds_each_policy() -> None:
    assert isinstance(make_queue("fifo", 4), FifoQueue)
    fair = make_queue("fair", 4)
    assert isinstance(fair, FairQueue) and fair.max_rows_per_tenant == 4


arrivals = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c", None]), st.integers(1, 50), st.integers(1, 6)),
    min_size=1,
    max_size=60,
)


def _run(q: FairQueue[Req], reqs: list[tuple[str | None, int, int]], rows: int, fits_cost: int) -> dict:
    """Admit into `rows` rows; each admitted request runs for its steps, charging a token a step."""
    items = [Req(t, c, str(i)) for i, (t, c, _) in enumerate(reqs)]
    steps_of = {id(r): s for r, (_, _, s) in zip(items, reqs, strict=True)}
    for r in items:
        q.push(r.tenant, r)
    running: list[tuple[Req, int]] = []
    served_order: list[Req] = []
    for _step in range(10_000):
        if not running and (
            not len(q) or all(_head(q, r.tenant) is not r or r.cost > fits_cost > 0 for r in q)
        ):
            break
        running = [(r, left - 1) for r, left in running]
        for r, _left in running:
            q.charge(r.tenant, 1)
        running = [(r, left) for r, left in running if left > 0]
        while len(running) < rows:
            rows_of = Counter(r.tenant for r, _ in running)
            fits = (lambda r: r.cost <= fits_cost) if fits_cost else _always
            pick = q.pick(rows_of, fits)
            if pick is None:
                # work-conserving: nothing left that a free row could take
                assert all(
                    q.capped(r.tenant, rows_of) or not fits(r) or r is not _head(q, r.tenant) for r in q
                )
                break
            assert not q.capped(pick.tenant, rows_of), "admitted past its tenant's cap"
            q.charge(pick.tenant, pick.cost)
            running.append((pick, steps_of[id(pick)]))
            served_order.append(pick)
    return {"order": served_order, "left": list(q)}


def _head(q: FairQueue[Req], tenant: str | None) -> Req:
    return next(r for r in q if r.tenant == tenant)


@settings(max_examples=200, deadline=None)
@given(arrivals, st.integers(1, 4), st.integers(1, 3))
def test_fair_queue_starves_no_one_and_respects_the_cap(reqs, rows: int, cap: int) -> None:
    q: FairQueue[Req] = FairQueue(max_rows_per_tenant=cap)
    result = _run(q, reqs, rows, fits_cost=0)
    assert not result["left"] and len(result["order"]) == len(reqs)  # everyone was served


@settings(max_examples=200, deadline=None)
@given(arrivals, st.integers(1, 4))
def test_a_head_that_does_not_fit_never_blocks_the_others(reqs, rows: int) -> None:
    q: FairQueue[Req] = FairQueue(max_rows_per_tenant=rows)
    result = _run(q, reqs, rows, fits_cost=25)
    left = result["left"]
    assert len(result["order"]) + len(left) == len(reqs)
    # what is left is only what could never fit, or stuck behind such a head in its own tenant's FIFO
    for tenant in {r.tenant for r in left}:
        assert _head(q, tenant).cost > 25


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(1, 50), min_size=2, max_size=40),
    st.lists(st.integers(1, 50), min_size=2, max_size=40),
)
def test_backlogged_tenants_service_differs_by_at_most_one_charge(a_costs, b_costs) -> None:
    q: FairQueue[Req] = FairQueue(max_rows_per_tenant=100)
    for t, costs in (("a", a_costs), ("b", b_costs)):
        for c in costs:
            q.push(t, Req(t, c))
    largest = max(a_costs + b_costs)
    while all(any(r.tenant == t for r in q) for t in ("a", "b")):
        pick = q.pick({}, _always)
        assert pick is not None
        q.charge(pick.tenant, pick.cost)
        assert abs(q.served["a"] - q.served["b"]) <= largest
