"""Identifier types shared by every service, with the validation that keeps them safe to use as keys."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated

from pydantic import AfterValidator, StringConstraints

# An adapter id is a stable opaque name, never a path: no slashes, no dots-only, no whitespace.
ADAPTER_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-.]{0,127}$")
TENANT_ID_RE = re.compile(r"^[a-z0-9][a-z0-9\-]{0,62}$")
# tenant/name:label, e.g. acme/support:prod
ALIAS_RE = re.compile(
    r"^(?P<tenant>[a-z0-9][a-z0-9\-]{0,62})/(?P<name>[A-Za-z0-9][A-Za-z0-9_\-.]{0,63})(:(?P<label>[A-Za-z0-9_\-.]{1,32}))?$"
)
REPLICA_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-]{0,63}$")
SHA256_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


def _check(pattern: re.Pattern[str], what: str) -> Callable[[str], str]:
    def check(value: str) -> str:
        if not pattern.fullmatch(value) or value in (".", ".."):
            raise ValueError(f"invalid {what}: {value!r}")
        return value

    return check


AdapterId = Annotated[
    str, StringConstraints(max_length=128), AfterValidator(_check(ADAPTER_ID_RE, "adapter_id"))
]
TenantId = Annotated[str, StringConstraints(max_length=63), AfterValidator(_check(TENANT_ID_RE, "tenant_id"))]
Alias = Annotated[str, StringConstraints(max_length=160), AfterValidator(_check(ALIAS_RE, "alias"))]
ReplicaId = Annotated[
    str, StringConstraints(max_length=64), AfterValidator(_check(REPLICA_ID_RE, "replica_id"))
]
Sha256 = Annotated[str, AfterValidator(_check(SHA256_RE, "checksum (want sha256:<64 lowercase hex>)"))]


def alias_tenant(alias: str) -> str:
    """The tenant that owns an alias is its namespace: acme/support:prod belongs to acme."""
    match = ALIAS_RE.fullmatch(alias)
    if match is None:
        raise ValueError(f"invalid alias: {alias!r}")
    return match.group("tenant")
