"""Rendezvous (highest-random-weight) owner selection: the one implementation every process imports.

score(adapter_id, replica_id) is a stable 64-bit hash of the pair; an adapter's owners are the k replicas
with the highest scores. The placement worker and the gateway router both call owners(), so they agree on
owners with no lookup table. Adding or removing one of N replicas changes the owners of about k/N of the
adapters, and only the placements on that replica move.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable


def score(adapter_id: str, replica_id: str) -> int:
    """A stable 64-bit score for the pair, the same in every process and Python version (not hash())."""
    digest = hashlib.blake2b(f"{adapter_id}\0{replica_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def ranked(adapter_id: str, replica_ids: Iterable[str]) -> list[str]:
    """All replicas in owner-preference order: highest score first, ties broken by replica id."""
    return sorted(set(replica_ids), key=lambda r: (-score(adapter_id, r), r))


def owners(adapter_id: str, replica_ids: Iterable[str], k: int) -> list[str]:
    """The top-k replicas for adapter_id (fewer when the fleet is smaller than k)."""
    if k < 1:
        raise ValueError(f"owner count must be >= 1, got {k}")
    return ranked(adapter_id, replica_ids)[:k]
