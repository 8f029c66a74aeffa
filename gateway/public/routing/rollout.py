"""Which version of an alias serves a request: its version, or its canary for `weight` of the requests.

The split is a hash of the alias and a sticky key (the request's `user` field when given, so one end user
sees one version, else the request id), mapped to [0, 1): keys below the weight go to the canary. The hash
is BLAKE2b, the same in every gateway process and across restarts. Pure.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass(frozen=True)
class AliasTarget:
    """Where an alias points: its version, and optionally a canary version with its share of requests."""

    adapter_id: str
    canary_adapter_id: str | None = None
    canary_weight: float = 0.0

    def pick(self, alias: str, key: str) -> str:
        """The version that serves the request with this sticky key."""
        if self.canary_adapter_id is None or self.canary_weight <= 0:
            return self.adapter_id
        return self.canary_adapter_id if unit_hash(alias, key) < self.canary_weight else self.adapter_id


def unit_hash(alias: str, key: str) -> float:
    """A uniform value in [0, 1) from the alias and the key (64 bits of BLAKE2b)."""
    digest = hashlib.blake2b(f"{alias}\0{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64
