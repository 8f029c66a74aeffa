"""Aliases in PostgreSQL: an atomic move that keeps previous_adapter_id, bumps the revision and writes the
aliases.changed outbox event in the same transaction. Only a ready version of the alias's tenant qualifies."""

from __future__ import annotations

import asyncpg

from gateway.errors import Conflict, InvalidRegistration, NotFound
from lorafleet.outbox.writer import emit
from schemas.api import AliasView
from schemas.events import AliasChanged
from schemas.ids import alias_tenant

COLUMNS = "alias, tenant_id, adapter_id, previous_adapter_id, revision, updated_at"


async def set_alias(pool: asyncpg.Pool, alias: str, adapter_id: str) -> tuple[AliasView, bool]:
    """Point alias at adapter_id; return (view, changed). Pointing at the current target changes nothing."""
    tenant = alias_tenant(alias)
    async with pool.acquire() as conn, conn.transaction():
        target = await conn.fetchrow(
            "SELECT tenant_id, status FROM adapters WHERE adapter_id = $1 FOR SHARE", adapter_id
        )
        if target is None:
            raise NotFound("adapter_not_found", f"adapter {adapter_id!r} does not exist", "adapter_id")
        if target["tenant_id"] != tenant:
            raise InvalidRegistration(
                "alias_tenant_mismatch",
                f"alias {alias!r} belongs to tenant {tenant!r}; adapter {adapter_id!r} does not",
                "adapter_id",
            )
        if target["status"] != "ready":
            raise Conflict(
                "adapter_not_ready", f"adapter {adapter_id!r} is {target['status']}, not ready", "adapter_id"
            )
        row = await conn.fetchrow(
            f"""INSERT INTO aliases (alias, tenant_id, adapter_id, previous_adapter_id, revision)
                VALUES ($1, $2, $3, NULL, 1)
                ON CONFLICT (alias) DO UPDATE
                    SET previous_adapter_id = aliases.adapter_id, adapter_id = EXCLUDED.adapter_id,
                        revision = aliases.revision + 1, updated_at = now()
                    WHERE aliases.adapter_id <> EXCLUDED.adapter_id
                RETURNING {COLUMNS}""",
            alias,
            tenant,
            adapter_id,
        )
        if row is None:
            current = await conn.fetchrow(f"SELECT {COLUMNS} FROM aliases WHERE alias = $1", alias)
            assert current is not None  # the upsert skipped only an alias that already points there
            return AliasView(**dict(current)), False
        view = AliasView(**dict(row))
        await emit(
            conn,
            AliasChanged(
                alias=view.alias,
                tenant_id=view.tenant_id,
                adapter_id=view.adapter_id,
                previous_adapter_id=view.previous_adapter_id,
                revision=view.revision,
            ),
        )
        return view, True


async def get_alias(pool: asyncpg.Pool, alias: str) -> AliasView:
    row = await pool.fetchrow(f"SELECT {COLUMNS} FROM aliases WHERE alias = $1", alias)
    if row is None:
        raise NotFound("alias_not_found", f"alias {alias!r} does not exist", "alias")
    return AliasView(**dict(row))


async def list_aliases(pool: asyncpg.Pool, tenant_id: str | None = None) -> list[AliasView]:
    rows = await pool.fetch(
        f"SELECT {COLUMNS} FROM aliases WHERE ($1::text IS NULL OR tenant_id = $1) ORDER BY alias", tenant_id
    )
    return [AliasView(**dict(r)) for r in rows]
