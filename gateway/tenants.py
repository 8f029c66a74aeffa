"""Tenants and API keys in PostgreSQL: create tenants, issue keys (the secret is returned once and only its
sha256 is stored), revoke keys, and look a key up with its tenant's limits."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

import asyncpg

KEY_PREFIX = "lf-"


@dataclass(frozen=True)
class Caller:
    """An authenticated tenant and its limits."""

    tenant_id: str
    key_id: str
    requests_per_s: float
    tokens_per_min: int


@dataclass(frozen=True)
class IssuedKey:
    key_id: str
    tenant_id: str
    secret: str  # shown once


def key_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


async def create_tenant(
    pool: asyncpg.Pool,
    tenant_id: str,
    requests_per_s: float | None = None,
    tokens_per_min: int | None = None,
    display_name: str = "",
) -> bool:
    """Create the tenant, or update its limits when given; True when it was new."""
    created = await pool.fetchval(
        """INSERT INTO tenants (tenant_id, display_name, requests_per_s, tokens_per_min)
           VALUES ($1, $2, coalesce($3, 10), coalesce($4, 200000))
           ON CONFLICT (tenant_id) DO UPDATE
               SET requests_per_s = coalesce($3, tenants.requests_per_s),
                   tokens_per_min = coalesce($4, tenants.tokens_per_min)
           RETURNING (xmax = 0) AS created""",
        tenant_id,
        display_name,
        requests_per_s,
        tokens_per_min,
    )
    return bool(created)


async def create_key(pool: asyncpg.Pool, tenant_id: str) -> IssuedKey:
    """Issue a new key for the tenant; the secret is not stored and cannot be shown again."""
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    key_id = "key_" + secrets.token_hex(8)
    await pool.execute(
        "INSERT INTO api_keys (key_id, tenant_id, key_hash, prefix) VALUES ($1, $2, $3, $4)",
        key_id,
        tenant_id,
        key_hash(secret),
        secret[:10],
    )
    return IssuedKey(key_id, tenant_id, secret)


async def revoke_key(pool: asyncpg.Pool, key_id: str) -> bool:
    """Revoke a key by id; True when a live key was revoked."""
    status = await pool.execute(
        "UPDATE api_keys SET revoked_at = now() WHERE key_id = $1 AND revoked_at IS NULL", key_id
    )
    return status.endswith(" 1")


async def list_keys(pool: asyncpg.Pool, tenant_id: str | None = None) -> list[dict]:
    rows = await pool.fetch(
        """SELECT key_id, tenant_id, prefix, created_at, revoked_at FROM api_keys
           WHERE ($1::text IS NULL OR tenant_id = $1) ORDER BY created_at""",
        tenant_id,
    )
    return [dict(r) for r in rows]


async def find_callers(pool: asyncpg.Pool, digests: list[str], timeout_s: float) -> dict[str, Caller]:
    """digest -> caller for each live key among these sha256 hex digests, in one statement."""
    rows = await pool.fetch(
        """SELECT k.key_id, k.key_hash, t.tenant_id, t.requests_per_s, t.tokens_per_min
           FROM api_keys k JOIN tenants t USING (tenant_id)
           WHERE k.key_hash = ANY($1::text[]) AND k.revoked_at IS NULL""",
        digests,
        timeout=timeout_s,
    )
    return {
        r["key_hash"]: Caller(r["tenant_id"], r["key_id"], r["requests_per_s"], r["tokens_per_min"])
        for r in rows
    }


async def find_caller(pool: asyncpg.Pool, digest: str) -> tuple[str, Caller] | None:
    """(stored hash, caller) for a live key with this sha256 hex digest, else None."""
    row = await pool.fetchrow(
        """SELECT k.key_id, k.key_hash, t.tenant_id, t.requests_per_s, t.tokens_per_min
           FROM api_keys k JOIN tenants t USING (tenant_id)
           WHERE k.key_hash = $1 AND k.revoked_at IS NULL""",
        digest,
    )
    if row is None:
        return None
    caller = Caller(row["tenant_id"], row["key_id"], row["requests_per_s"], row["tokens_per_min"])
    return row["key_hash"], caller
