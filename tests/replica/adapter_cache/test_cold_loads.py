"""ColdLoadGate: per-tenant and total caps on cold loads; a repeat of a load in progress joins it."""

from __future__ import annotations

import pytest

from replica.adapter_cache.cold_loads import ColdLoadGate
from replica.adapter_cache.errors import ColdLoadsFullError, TenantColdLoadsError


def test_a_tenant_gets_its_share_and_a_repeat_joins_without_counting() -> None:
    gate = ColdLoadGate(per_tenant=2, total=3)
    assert gate.admit("a1", "acme") and gate.admit("a2", "acme")
    assert gate.admit("a1", "acme") is False  # joins a1's load
    with pytest.raises(TenantColdLoadsError) as refused:
        gate.admit("a3", "acme")
    assert refused.value.status == 429 and refused.value.headers() == {"Retry-After": "1"}
    gate.done("a1")
    assert gate.admit("a3", "acme")
    assert gate.loading() == {"a2": "acme", "a3": "acme"}


def test_the_replica_cap_holds_across_tenants_and_frees_as_loads_end() -> None:
    gate = ColdLoadGate(per_tenant=2, total=3)
    assert gate.admit("a1", "acme") and gate.admit("g1", "globex") and gate.admit("g2", "globex")
    with pytest.raises(ColdLoadsFullError) as full:
        gate.admit("i1", "initech")
    assert full.value.status == 503 and full.value.code == "cold_loads_full"
    gate.done("g1")
    gate.done("g1")  # idempotent
    assert gate.admit("i1", "initech")
    assert gate.loading() == {"a1": "acme", "g2": "globex", "i1": "initech"}
