"""The adapter registry in PostgreSQL: register a version (row + outbox event in one transaction), read it,
and settle it as ready or rejected. An adapter_id names one immutable version."""

from __future__ import annotations

from typing import Any

import asyncpg

from gateway.errors import Conflict, InvalidRegistration
from lorafleet.db.conn import Connection
from lorafleet.outbox.writer import emit
from schemas.api import AdapterRegistration, AdapterStatus, AdapterView
from schemas.events import AdapterRegistered, AdapterValidated, ValidationStatus

CONTENT_FIELDS = (
    "tenant_id",
    "version",
    "base_model_hash",
    "rank",
    "alpha",
    "target_modules",
    "weights_uri",
    "checksum",
)
COLUMNS = (
    "adapter_id, tenant_id, version, status, base_model_hash, rank, alpha, target_modules, weights_uri, "
    "checksum, size_bytes, reason_code, reason, created_at, updated_at, check_attempts, last_check_error, "
    "next_check_at"
)


def same_content(row: asyncpg.Record | dict[str, Any], fields: dict[str, Any]) -> bool:
    """Whether a stored version and a registration describe the same immutable content."""
    return all(
        (list(row[f]) == list(fields[f])) if f == "target_modules" else row[f] == fields[f]
        for f in CONTENT_FIELDS
    )


def content_of(reg: AdapterRegistration | AdapterRegistered) -> dict[str, Any]:
    return {f: getattr(reg, f) for f in ("adapter_id", *CONTENT_FIELDS)}


async def tenant_exists(conn: Connection, tenant_id: str) -> bool:
    return bool(await conn.fetchval("SELECT true FROM tenants WHERE tenant_id = $1", tenant_id))


async def insert_pending(conn: Connection, fields: dict[str, Any]) -> asyncpg.Record | None:
    """Insert the version as pending; return the existing row instead when the id is taken."""
    inserted = await conn.fetchval(
        """INSERT INTO adapters (adapter_id, tenant_id, version, base_model_hash, rank, alpha,
                                 target_modules, weights_uri, checksum, status)
           VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'pending')
           ON CONFLICT (adapter_id) DO NOTHING RETURNING true""",
        fields["adapter_id"],
        fields["tenant_id"],
        fields["version"],
        fields["base_model_hash"],
        fields["rank"],
        fields["alpha"],
        list(fields["target_modules"]),
        fields["weights_uri"],
        fields["checksum"],
    )
    if inserted:
        return None
    return await conn.fetchrow(f"SELECT {COLUMNS} FROM adapters WHERE adapter_id = $1", fields["adapter_id"])


async def register(pool: asyncpg.Pool, reg: AdapterRegistration) -> tuple[bool, AdapterStatus]:
    """The HTTP door after the field checks: (created, status). Same content again changes nothing;
    different content under a taken adapter_id is a Conflict."""
    fields = content_of(reg)
    async with pool.acquire() as conn, conn.transaction():
        if not await tenant_exists(conn, reg.tenant_id):
            raise InvalidRegistration(
                "unknown_tenant", f"tenant {reg.tenant_id!r} does not exist", "tenant_id"
            )
        existing = await insert_pending(conn, fields)
        if existing is not None:
            if not same_content(existing, fields):
                raise Conflict(
                    "adapter_conflict",
                    f"adapter {reg.adapter_id!r} is already registered with different content; "
                    "versions are immutable, register a new adapter_id",
                    "adapter_id",
                )
            return False, existing["status"]
        await emit(conn, AdapterRegistered(**fields))
        return True, "pending"


async def settle(
    conn: Connection,
    row: asyncpg.Record | dict[str, Any],
    status: ValidationStatus,
    reason_code: str | None = None,
    reason: str | None = None,
    size_bytes: int | None = None,
) -> bool:
    """Move a pending version to ready or rejected and emit adapters.validated; False if already settled."""
    updated = await conn.fetchval(
        """UPDATE adapters SET status = $2, reason_code = $3, reason = $4, size_bytes = $5, updated_at = now()
           WHERE adapter_id = $1 AND status = 'pending' RETURNING true""",
        row["adapter_id"],
        status,
        reason_code,
        reason,
        size_bytes,
    )
    if not updated:
        return False
    await emit(conn, validated_event(row, status, reason_code, reason, size_bytes))
    return True


def validated_event(
    row: asyncpg.Record | dict[str, Any],
    status: ValidationStatus,
    reason_code: str | None = None,
    reason: str | None = None,
    size_bytes: int | None = None,
) -> AdapterValidated:
    return AdapterValidated(
        adapter_id=row["adapter_id"],
        tenant_id=row["tenant_id"],
        version=row["version"],
        status=status,
        reason_code=reason_code,
        reason=reason[:2000] if reason else None,
        size_bytes=size_bytes,
    )


async def get_adapter(conn: Connection | asyncpg.Pool, adapter_id: str) -> AdapterView | None:
    row = await conn.fetchrow(f"SELECT {COLUMNS} FROM adapters WHERE adapter_id = $1", adapter_id)
    return AdapterView(**dict(row)) if row else None


async def list_adapters(
    pool: asyncpg.Pool, tenant_id: str | None = None, status: str | None = None, limit: int = 500
) -> list[AdapterView]:
    rows = await pool.fetch(
        f"""SELECT {COLUMNS} FROM adapters
            WHERE ($1::text IS NULL OR tenant_id = $1) AND ($2::text IS NULL OR status = $2)
            ORDER BY tenant_id, adapter_id LIMIT $3""",
        tenant_id,
        status,
        limit,
    )
    return [AdapterView(**dict(r)) for r in rows]


async def defer_check(
    conn: Connection, adapter_id: str, error: str, initial_s: float, max_s: float
) -> asyncpg.Record | None:
    """Record a check the object store failed on a pending version: one more attempt, its error, and the next
    check after a backoff doubling from initial_s up to max_s. None when the version is no longer pending."""
    return await conn.fetchrow(
        """UPDATE adapters SET check_attempts = check_attempts + 1, last_check_error = $2,
               next_check_at = now() + make_interval(secs => least($4, $3 * 2 ^ least(check_attempts, 30)))
           WHERE adapter_id = $1 AND status = 'pending'
           RETURNING check_attempts, next_check_at""",
        adapter_id,
        error[:2000],
        initial_s,
        max_s,
    )


async def claim_due_checks(conn: Connection, after_s: float, limit: int = 100) -> list[asyncpg.Record]:
    """Pending versions whose check is due (next_check_at passed, or never checked within after_s of their
    registration), each pushed after_s into the future so that it is claimed once per after_s. Rows another
    transaction holds are skipped, so reconcilers in several validators claim each row once."""
    prefixed = ", ".join(f"a.{c.strip()}" for c in COLUMNS.split(","))
    return await conn.fetch(
        f"""WITH due AS (
                SELECT adapter_id FROM adapters
                WHERE status = 'pending'
                  AND coalesce(next_check_at, created_at + make_interval(secs => $1)) <= now()
                ORDER BY created_at LIMIT $2 FOR UPDATE SKIP LOCKED)
            UPDATE adapters a SET next_check_at = now() + make_interval(secs => $1)
            FROM due WHERE a.adapter_id = due.adapter_id
            RETURNING {prefixed}""",
        after_s,
        limit,
    )


def registered_event(row: asyncpg.Record | dict[str, Any]) -> AdapterRegistered:
    """The adapters.registered event that asks for a stored version's check again (a new event_id)."""
    return AdapterRegistered(**{f: row[f] for f in ("adapter_id", *CONTENT_FIELDS)})
