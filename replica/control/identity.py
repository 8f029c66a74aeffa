"""The replica's identity key: a random secret kept in its data folder, created on the first start.

The database binds a replica id to the first key that registers it (schemas/sql/014_replica_identity.sql),
so the same replica, restarted or rescheduled with its folder (a volume of its own in Kubernetes), registers
again at a new address, and another replica cannot take its id. Losing the folder loses the id: an
operator releases it with `lorafleet db forget-replica`.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

KEY_BYTES = 32


def identity_key(path: Path) -> str:
    """The key in path, created there (owner-only) when the file does not exist yet."""
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    key = secrets.token_urlsafe(KEY_BYTES)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another start of the same replica wrote it first
        return path.read_text().strip()
    with os.fdopen(fd, "w") as out:
        out.write(key + "\n")
    return key
