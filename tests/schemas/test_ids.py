"""Identifiers: aliases carry their tenant, adapter ids are never paths."""

from __future__ import annotations

import pytest
from pydantic import TypeAdapter, ValidationError

from schemas.ids import AdapterId, Alias, alias_tenant


@pytest.mark.parametrize("alias, tenant", [("acme/support:prod", "acme"), ("globex-2/bot", "globex-2")])
def test_an_alias_belongs_to_its_namespace(alias: str, tenant: str) -> None:
    assert TypeAdapter(Alias).validate_python(alias) == alias
    assert alias_tenant(alias) == tenant


@pytest.mark.parametrize("bad", ["acme", "/support:prod", "acme/support:", "ACME/x", "acme/../x", "a/b/c"])
def test_malformed_aliases_are_rejected(bad: str) -> None:
    with pytest.raises(ValidationError):
        TypeAdapter(Alias).validate_python(bad)


@pytest.mark.parametrize("bad", ["../x", "a/b", "/etc/passwd", "", ".", "..", "a b", "x" * 200, "s3://b/k"])
def test_adapter_ids_cannot_be_paths_or_uris(bad: str) -> None:
    with pytest.raises(ValidationError):
        TypeAdapter(AdapterId).validate_python(bad)
