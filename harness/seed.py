"""Rows that bench and test stacks write straight into a migrated database: tenants with keys, ready
adapters and aliases.

A stack that measures or tests the serving path needs adapter versions the validator has already passed;
writing them here skips the upload and validation, which those stacks do not exercise.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import asyncpg

from gateway.tenants import create_key, create_tenant
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


@dataclass(frozen=True)
class Tenant:
    """A tenant with its limits; the seed issues it one API key."""

    tenant_id: str
    requests_per_s: float
    tokens_per_min: int


@dataclass(frozen=True)
class Alias:
    """An alias of the tenant, pointing at one of its adapters."""

    alias: str
    tenant_id: str
    adapter_id: str

    @classmethod
    def of(cls, alias: str, adapter_id: str) -> Alias:
        """The alias "<tenant>/<name>" of that tenant."""
        return cls(alias, alias.split("/", 1)[0], adapter_id)


@dataclass(frozen=True)
class Seed:
    """The rows a stack's database starts with: tenants (one key each), ready adapters and aliases."""

    tenants: tuple[Tenant, ...] = ()
    adapters: tuple[ReadyAdapter, ...] = ()
    aliases: tuple[Alias, ...] = ()

    def __add__(self, other: Seed) -> Seed:
        tenants, adapters = self.tenants + other.tenants, self.adapters + other.adapters
        return Seed(tenants, adapters, self.aliases + other.aliases)

    def problems(self) -> list[str]:
        """Why the rows would not insert or would point nowhere; empty when they are sound."""
        tenants = {t.tenant_id for t in self.tenants}
        owner = {a.adapter_id: a.tenant_id for a in self.adapters}
        out = [f"tenant {t} twice" for t in _twice(t.tenant_id for t in self.tenants)]
        out += [f"adapter {a} twice" for a in _twice(f"{a.adapter_id} v{a.version}" for a in self.adapters)]
        out += [f"alias {a} twice" for a in _twice(a.alias for a in self.aliases)]
        out += [
            f"adapter {a.adapter_id}: no tenant {a.tenant_id}"
            for a in self.adapters
            if a.tenant_id not in tenants
        ]
        out += [
            f"alias {a.alias}: tenant {a.tenant_id} has no adapter {a.adapter_id}"
            for a in self.aliases
            if owner.get(a.adapter_id) != a.tenant_id
        ]
        return out


def _twice(names: Iterable[str]) -> list[str]:
    """The names that occur more than once, sorted."""
    seen = Counter(names)
    return sorted(name for name, count in seen.items() if count > 1)


async def write_seed(pool: asyncpg.Pool, seed: Seed) -> dict[str, str]:
    """Insert the seed's rows into a migrated database; tenant -> the secret of its new API key."""
    problems = seed.problems()
    if problems:
        raise ValueError("; ".join(problems))
    for t in seed.tenants:
        await create_tenant(pool, t.tenant_id, t.requests_per_s, t.tokens_per_min)
    await insert_ready_adapters(pool, seed.adapters)
    for a in seed.aliases:
        await insert_alias(pool, a.alias, a.tenant_id, a.adapter_id)
    return {t.tenant_id: (await create_key(pool, t.tenant_id)).secret for t in seed.tenants}
