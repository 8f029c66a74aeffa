"""Caps on concurrent cold loads (adapters on no tier of the replica: fetched), per tenant and in all.

A request whose adapter is already being loaded joins that load and takes nothing (single flight); a new
load is admitted while its tenant holds fewer than `per_tenant` loads and the replica fewer than `total`,
and refused otherwise with a retryable error, so one tenant asking for many cold adapters cannot fill the
replica's fetch and validation work and starve the others.
"""

from __future__ import annotations

from collections import Counter

from replica.adapter_cache.errors import ColdLoadsFullError, TenantColdLoadsError


class ColdLoadGate:
    """adapter_id -> tenant of the cold loads in progress; plain state, called from the event loop."""

    def __init__(self, per_tenant: int, total: int) -> None:
        self.per_tenant, self.total = per_tenant, total
        self._loading: dict[str, str] = {}
        self._by_tenant: Counter[str] = Counter()

    def admit(self, adapter_id: str, tenant_id: str) -> bool:
        """True: this caller's load is counted (call done() when it ends); False: it joins one counted."""
        if adapter_id in self._loading:
            return False
        if self._by_tenant[tenant_id] >= self.per_tenant:
            raise TenantColdLoadsError(
                f"tenant {tenant_id!r} already has {self.per_tenant} adapters loading on this replica; "
                "retry shortly"
            )
        if len(self._loading) >= self.total:
            raise ColdLoadsFullError(f"this replica is loading {self.total} adapters already; retry shortly")
        self._loading[adapter_id] = tenant_id
        self._by_tenant[tenant_id] += 1
        return True

    def done(self, adapter_id: str) -> None:
        tenant_id = self._loading.pop(adapter_id, None)
        if tenant_id is not None:
            self._by_tenant[tenant_id] -= 1
            if self._by_tenant[tenant_id] <= 0:
                del self._by_tenant[tenant_id]

    def loading(self) -> dict[str, str]:
        return dict(self._loading)
