"""Aliases in PostgreSQL: an atomic move that keeps previous_adapter_id, bumps the revision and writes the
aliases.changed outbox event in the same transaction. Only a ready version of the alias's tenant qualifies,
as the version and as a canary."""

from __future__ import annotations

import asyncpg

from gateway.errors import Conflict, InvalidRegistration, NotFound
from lorafleet.db.conn import Connection
from lorafleet.outbox.writer import emit
from schemas.api import AliasView, CanaryTarget
from schemas.events import AliasChanged
from schemas.ids import alias_tenant

_VIEW_FIELDS = (
    "alias",
    "tenant_id",
    "adapter_id",
    "previous_adapter_id",
    "canary_adapter_id",
    "canary_weight",
)
COLUMNS = ", ".join((*_VIEW_FIELDS, "revision", "updated_at"))


async def _check_target(conn: Connection, alias: str, tenant: str, adapter_id: str, param: str) -> None:
    """The version exists, is the alias's tenant's and is ready (locked FOR SHARE until the move commits)."""
    target = await conn.fetchrow(
        "SELECT tenant_id, status FROM adapters WHERE adapter_id = $1 FOR SHARE", adapter_id
    )
    if target is None:
        raise NotFound("adapter_not_found", f"adapter {adapter_id!r} does not exist", param)
    if target["tenant_id"] != tenant:
        raise InvalidRegistration(
            "alias_tenant_mismatch",
            f"alias {alias!r} belongs to tenant {tenant!r}; adapter {adapter_id!r} does not",
            param,
        )
    if target["status"] != "ready":
        raise Conflict("adapter_not_ready", f"adapter {adapter_id!r} is {target['status']}, not ready", param)


async def set_alias(
    pool: asyncpg.Pool, alias: str, adapter_id: str, canary: CanaryTarget | None = None
) -> tuple[AliasView, bool]:
    """Point alias at adapter_id, with the canary or with none; return (view, changed). Setting what the alias
    already has changes nothing. previous_adapter_id is the version before the last change of adapter_id."""
    tenant = alias_tenant(alias)
    async with pool.acquire() as conn, conn.transaction():
        await _check_target(conn, alias, tenant, adapter_id, "adapter_id")
        if canary is not None:
            if canary.adapter_id == adapter_id:
                raise InvalidRegistration(
                    "canary_is_current",
                    "the canary must be another version than adapter_id",
                    "canary.adapter_id",
                )
            await _check_target(conn, alias, tenant, canary.adapter_id, "canary.adapter_id")
        row = await conn.fetchrow(
            f"""INSERT INTO aliases AS a (alias, tenant_id, adapter_id, previous_adapter_id,
                                          canary_adapter_id, canary_weight, revision)
                VALUES ($1, $2, $3, NULL, $4, $5, 1)
                ON CONFLICT (alias) DO UPDATE
                    SET previous_adapter_id = CASE WHEN a.adapter_id <> EXCLUDED.adapter_id
                                                   THEN a.adapter_id ELSE a.previous_adapter_id END,
                        adapter_id = EXCLUDED.adapter_id,
                        canary_adapter_id = EXCLUDED.canary_adapter_id,
                        canary_weight = EXCLUDED.canary_weight,
                        revision = a.revision + 1, updated_at = now()
                    WHERE (a.adapter_id, a.canary_adapter_id, a.canary_weight) IS DISTINCT FROM
                          (EXCLUDED.adapter_id, EXCLUDED.canary_adapter_id, EXCLUDED.canary_weight)
                RETURNING {COLUMNS}""",
            alias,
            tenant,
            adapter_id,
            canary.adapter_id if canary is not None else None,
            canary.weight if canary is not None else None,
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
                canary_adapter_id=view.canary_adapter_id,
                canary_weight=view.canary_weight,
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
