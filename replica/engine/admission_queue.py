"""The waiting queue the scheduler admits from, pure: FIFO, or a fair share of tokens across tenants.

Fair (weighted fair queuing on tokens, VTC-style): each tenant has a virtual counter of the tokens it was
served (its prompts at admission, its generated tokens as they come). The next row goes to the waiting
request at the head of the tenant with the least counter, among tenants under their cap of concurrent
rows; within a tenant, first come first served. A tenant that joins the backlog starts at the least
counter of the tenants already waiting, so idle time banks no credit; once nobody waits, every counter is
forgotten (they only order requests that contend). While tenants stay backlogged,
their counters differ by at most the largest single charge: a burst from one tenant moves the others'
next admission by at most that much service, never behind the whole burst. Requests that name no tenant
(benchmarks, direct callers) are one more tenant, without a cap.

Work-conserving: pick returns a request whenever some tenant under its cap has one that fits; a head that
does not fit (fits is False) is passed over for the next tenant's, never dropped.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Generic, Protocol, TypeVar

T = TypeVar("T")


class AdmissionQueue(Protocol[T]):
    """What the scheduler needs of its waiting queue."""

    def push(self, tenant: str | None, item: T) -> None: ...

    def push_front(self, tenant: str | None, item: T) -> None:
        """Queue a preempted request ahead of its tenant's others: it keeps its place in line."""
        ...

    def remove(self, item: T) -> None: ...

    def pick(self, running: Mapping[str | None, int], fits: Callable[[T], bool]) -> T | None: ...

    def charge(self, tenant: str | None, tokens: int) -> None: ...

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[T]: ...


class FifoQueue(Generic[T]):
    """First come, first served over every tenant; a request that does not fit waits for a later step."""

    def __init__(self) -> None:
        self._items: deque[T] = deque()

    def push(self, tenant: str | None, item: T) -> None:
        self._items.append(item)

    def push_front(self, tenant: str | None, item: T) -> None:
        self._items.appendleft(item)

    def remove(self, item: T) -> None:
        self._items.remove(item)

    def pick(self, running: Mapping[str | None, int], fits: Callable[[T], bool]) -> T | None:
        for item in self._items:
            if fits(item):
                self._items.remove(item)
                return item
        return None

    def charge(self, tenant: str | None, tokens: int) -> None:
        return None

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[T]:
        return iter(list(self._items))


class FairQueue(Generic[T]):
    """Per-tenant FIFO queues served by least virtual token counter, each tenant capped in rows."""

    def __init__(self, max_rows_per_tenant: int) -> None:
        assert max_rows_per_tenant >= 1
        self.max_rows_per_tenant = max_rows_per_tenant
        self.served: dict[str | None, float] = {}  # tenant -> virtual counter (tokens)
        self._queues: dict[str | None, deque[T]] = {}
        self._tenant_of: dict[int, str | None] = {}  # id(item) -> its tenant

    def push(self, tenant: str | None, item: T) -> None:
        self._join(tenant).append(item)
        self._tenant_of[id(item)] = tenant

    def push_front(self, tenant: str | None, item: T) -> None:
        self._join(tenant).appendleft(item)
        self._tenant_of[id(item)] = tenant

    def _join(self, tenant: str | None) -> deque[T]:
        """The tenant's queue; a tenant joining the backlog starts at the least counter of those waiting."""
        if not self._queues:
            self.served.clear()
        if tenant not in self._queues:
            floor = min((self.served[t] for t in self._queues), default=None)
            if floor is not None:
                self.served[tenant] = max(self.served.get(tenant, 0.0), floor)
            else:
                self.served.setdefault(tenant, 0.0)
        return self._queues.setdefault(tenant, deque())

    def remove(self, item: T) -> None:
        tenant = self._tenant_of.pop(id(item))
        self._queues[tenant].remove(item)
        self._drop_if_empty(tenant)

    def _drop_if_empty(self, tenant: str | None) -> None:
        if not self._queues[tenant]:
            del self._queues[tenant]

    def capped(self, tenant: str | None, running: Mapping[str | None, int]) -> bool:
        """Whether the tenant holds its cap of rows (requests without a tenant are never capped)."""
        return tenant is not None and running.get(tenant, 0) >= self.max_rows_per_tenant

    def pick(self, running: Mapping[str | None, int], fits: Callable[[T], bool]) -> T | None:
        waiting = [t for t in self._queues if not self.capped(t, running)]
        for tenant in sorted(waiting, key=lambda t: (self.served[t], t or "")):
            queue = self._queues[tenant]
            head = queue[0]
            if fits(head):
                queue.popleft()
                del self._tenant_of[id(head)]
                self._drop_if_empty(tenant)
                return head
        return None

    def charge(self, tenant: str | None, tokens: int) -> None:
        self.served[tenant] = self.served.get(tenant, 0.0) + tokens

    def __len__(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def __iter__(self) -> Iterator[T]:
        return iter([item for q in self._queues.values() for item in q])


def make_queue(policy: str, max_rows_per_tenant: int) -> AdmissionQueue:
    """The waiting queue of an admission policy by name (fifo | fair)."""
    table: dict[str, Callable[[], AdmissionQueue]] = {
        "fifo": FifoQueue,
        "fair": lambda: FairQueue(max_rows_per_tenant),
    }
    return table[policy]()
