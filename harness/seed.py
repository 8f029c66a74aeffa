"""Rows that bench and test stacks write straight into a migrated database: ready adapters and aliases.

A stack that measures or tests the serving path needs adapter versions the validator has already passed;
writing them here skips the upload and validation, which those stacks do not exercise.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import asyncpg

from lorafleet.client.upload import artifact_prefix
from lorafleet.db.conn import Connection

BUCKET = "lorafleet-adapters"  # the platform's default bucket
UNCHECKED = "sha256:" + "0" * 64  # the checksum of a version whose weights nothing fetches from the store


@dataclass(frozen=True)
class ReadyAdapter:
    """One adapter version with status ready; weights_uri "" is the default upload's place in the store."""

    adapter_id: str
    tenant_id: str
    base_model_hash: str
    version: int = 1
    checksum: str = UNCHECKED
    weights_uri: str = ""
    rank: int = 8
    alpha: int = 16
    target_modules: tuple[str, ...] = ("q_proj", "v_proj")

    def row(self) -> tuple[object, ...]:
        default_uri = f"s3://{BUCKET}/{artifact_prefix(self.tenant_id, self.adapter_id)}"
        return (
            self.adapter_id,
            self.tenant_id,
            self.version,
            self.base_model_hash,
            self.rank,
            self.alpha,
            list(self.target_modules),
            self.weights_uri or default_uri,
            self.checksum,
        )


async def insert_ready_adapters(db: asyncpg.Pool | Connection, adapters: Iterable[ReadyAdapter]) -> None:
    """Insert each version as ready (its tenant must exist)."""
    await db.executemany(
        """INSERT INTO adapters (adapter_id, tenant_id, version, base_model_hash, rank, alpha,
               target_modules, weights_uri, checksum, status)
           VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'ready')""",
        [a.row() for a in adapters],
    )


async def insert_alias(db: asyncpg.Pool | Connection, alias: str, tenant_id: str, adapter_id: str) -> None:
    """Point a new alias of the tenant at adapter_id."""
    await db.execute(
        "INSERT INTO aliases (alias, tenant_id, adapter_id) VALUES ($1, $2, $3)", alias, tenant_id, adapter_id
    )
