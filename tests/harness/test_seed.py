"""A stack's seed as a plan: sound rows pass, and rows that would not insert or would point nowhere are
named before anything is written."""

from __future__ import annotations

from harness.seed import Alias, ReadyAdapter, Seed, Tenant

ACME = Tenant("acme", 50, 200_000)
GLOBEX = Tenant("globex", 2, 200_000)


def _seed() -> Seed:
    return Seed(
        (ACME, GLOBEX),
        (ReadyAdapter("acme-v1", "acme", "h"), ReadyAdapter("acme-v2", "acme", "h", version=2)),
        (Alias.of("acme/support:prod", "acme-v1"),),
    )


def test_an_alias_names_its_tenant_before_the_slash() -> None:
    assert Alias.of("acme/support:prod", "acme-v1") == Alias("acme/support:prod", "acme", "acme-v1")


def test_a_sound_seed_has_no_problems_and_adding_seeds_keeps_every_row_in_order() -> None:
    lean = Seed((Tenant("lean", 50, 1_000),), (ReadyAdapter("lean-v1", "lean", "h"),))
    both = _seed() + lean
    assert _seed().problems() == [] and both.problems() == []
    assert [t.tenant_id for t in both.tenants] == ["acme", "globex", "lean"]
    assert [a.adapter_id for a in both.adapters] == ["acme-v1", "acme-v2", "lean-v1"]
    assert both.aliases == _seed().aliases


def test_rows_twice_a_missing_tenant_and_an_alias_to_another_tenants_adapter_are_problems() -> None:
    bad = _seed() + Seed(
        (ACME,),
        (ReadyAdapter("acme-v1", "acme", "h"), ReadyAdapter("x-v1", "initech", "h")),
        (Alias.of("acme/support:prod", "acme-v1"), Alias.of("globex/sales:prod", "acme-v2")),
    )
    assert bad.problems() == [
        "tenant acme twice",
        "adapter acme-v1 v1 twice",
        "alias acme/support:prod twice",
        "adapter x-v1: no tenant initech",
        "alias globex/sales:prod: tenant globex has no adapter acme-v2",
    ]
