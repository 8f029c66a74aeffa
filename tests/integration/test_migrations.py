"""Migrations apply on an empty database, re-apply as a no-op, and a failing one changes nothing."""

from __future__ import annotations

import shutil
from importlib import resources
from pathlib import Path

import asyncpg
import pytest

from lorafleet.db.migrate import MigrationError, load_migrations, migrate

pytestmark = pytest.mark.integration


async def _tables(dsn: str) -> set[str]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        return {r["tablename"] for r in rows}
    finally:
        await conn.close()


async def test_migrations_apply_on_an_empty_database_then_twice_is_a_no_op(fresh_db: str) -> None:
    first = await migrate(fresh_db)
    assert first == [m.version for m in load_migrations()]
    tables = await _tables(fresh_db)
    expected = {
        "adapters",
        "aliases",
        "placements",
        "adapter_stats",
        "outbox",
        "tenants",
        "api_keys",
        "replicas",
        "processed_events",
        "schema_migrations",
    }
    assert expected <= tables
    assert await migrate(fresh_db) == []


def _copy_sql(tmp_path: Path) -> Path:
    folder = tmp_path / "sql"
    shutil.copytree(str(resources.files("schemas") / "sql"), folder)
    return folder


async def test_a_failing_migration_leaves_the_database_as_it_was(fresh_db: str, tmp_path: Path) -> None:
    folder = _copy_sql(tmp_path)
    await migrate(fresh_db, folder)
    before = await _tables(fresh_db)
    (folder / "900_broken.sql").write_text("CREATE TABLE half_done (id int);\nSELECT * FROM no_such_table;\n")
    with pytest.raises(MigrationError, match="900_broken"):
        await migrate(fresh_db, folder)
    assert await _tables(fresh_db) == before
    conn = await asyncpg.connect(fresh_db)
    try:
        assert await conn.fetchval("SELECT count(*) FROM schema_migrations WHERE version = 900") == 0
    finally:
        await conn.close()


async def test_an_applied_migration_that_changed_is_refused(fresh_db: str, tmp_path: Path) -> None:
    folder = _copy_sql(tmp_path)
    await migrate(fresh_db, folder)
    first = sorted(folder.glob("001_*.sql"))[0]
    first.write_text(first.read_text() + "\n-- edited after release\n")
    with pytest.raises(MigrationError, match="changed after it was applied"):
        await migrate(fresh_db, folder)


HASH = "sha256:" + "ab" * 32


async def _seed(conn: asyncpg.Connection) -> None:
    await conn.execute("INSERT INTO tenants (tenant_id) VALUES ('acme'), ('globex')")
    for adapter_id, tenant, status, code in [
        ("acme-support-v1", "acme", "ready", None),
        ("acme-support-v2", "acme", "pending", None),
        ("globex-bot-v1", "globex", "ready", None),
    ]:
        await conn.execute(
            """INSERT INTO adapters (adapter_id, tenant_id, version, base_model_hash, rank, alpha, target_modules,
                                     weights_uri, checksum, status, reason_code)
               VALUES ($1, $2, 1, $3, 8, 16, ARRAY['q_proj'], 's3://b/x', $3, $4, $5)""",
            adapter_id,
            tenant,
            HASH,
            status,
            code,
        )


async def test_database_constraints_keep_aliases_inside_their_tenant_and_on_ready_adapters(
    migrated_db: str,
) -> None:
    conn = await asyncpg.connect(migrated_db)
    try:
        await _seed(conn)
        await conn.execute(
            "INSERT INTO aliases (alias, tenant_id, adapter_id) VALUES ('acme/support:prod', 'acme', 'acme-support-v1')"
        )
        # another tenant's adapter
        with pytest.raises(asyncpg.ForeignKeyViolationError):
            await conn.execute(
                "INSERT INTO aliases (alias, tenant_id, adapter_id) VALUES ('acme/x:prod', 'acme', 'globex-bot-v1')"
            )
        # an alias outside its tenant's namespace
        with pytest.raises(asyncpg.CheckViolationError):
            await conn.execute(
                "INSERT INTO aliases (alias, tenant_id, adapter_id) VALUES ('globex/y:prod', 'acme', 'acme-support-v1')"
            )
        # a version that is not ready yet
        with pytest.raises(asyncpg.CheckViolationError, match="status pending"):
            await conn.execute(
                "UPDATE aliases SET adapter_id = 'acme-support-v2' WHERE alias = 'acme/support:prod'"
            )
        # ready is final
        with pytest.raises(asyncpg.CheckViolationError, match="cannot become"):
            await conn.execute("UPDATE adapters SET status = 'pending' WHERE adapter_id = 'acme-support-v1'")
        # a rejected version must say why
        with pytest.raises(asyncpg.CheckViolationError):
            await conn.execute("UPDATE adapters SET status = 'rejected' WHERE adapter_id = 'acme-support-v2'")
    finally:
        await conn.close()
