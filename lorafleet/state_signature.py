"""replica.state signed by the replica that sends it, so no replica can publish state under another's id.

A replica's state key is derived from its identity key (replica/control/identity.py) and registered with its
address (schemas/sql/015_replica_state_key.sql); the replicas' database role cannot read it back, so one
replica never learns another's. Each replica.state record carries, in a Kafka header, an HMAC of its value
bytes under that key; the gateway applies a state only when the header verifies against the key registered
for the state's replica id (gateway/public/routing/replica_view.py).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

SIGNATURE_HEADER = "lorafleet-state-signature"
_PURPOSE = b"lorafleet replica.state"


def state_key(identity_key: str) -> str:
    """The key a replica signs its states with, derived from its identity key (hex)."""
    return hmac.new(identity_key.encode(), _PURPOSE, hashlib.sha256).hexdigest()


def sign(key: str, value: bytes) -> bytes:
    """The header value for one record's value bytes."""
    return hmac.new(bytes.fromhex(key), value, hashlib.sha256).hexdigest().encode()


def verify(key: str | None, value: bytes, signature: bytes | None) -> bool:
    """Whether signature is value's under key (False without a key or a signature)."""
    if not key or not signature:
        return False
    return hmac.compare_digest(sign(key, value), signature)


def header(headers: object) -> bytes | None:
    """The signature among a Kafka record's headers ((name, value) pairs, or a mapping), if any."""
    pairs = headers.items() if isinstance(headers, Mapping) else headers or ()
    for name, value in pairs:  # type: ignore[attr-defined]
        if name == SIGNATURE_HEADER:
            return bytes(value)
    return None
