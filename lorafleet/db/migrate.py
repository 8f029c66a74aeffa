"""Apply schemas/sql/NNN_*.sql in order, each in its own transaction, recording what was applied."""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import asyncpg

log = logging.getLogger(__name__)

_FILE_RE = re.compile(r"^(\d{3})_([a-z0-9_]+)\.sql$")
# Serialises concurrent `migrate` runs (two processes starting at once).
_LOCK_KEY = 0x6C6F7261  # "lora"


class MigrationError(RuntimeError):
    """A migration failed or an applied migration file was changed afterwards."""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def load_migrations(folder: Path | None = None) -> list[Migration]:
    """The migration files in version order; duplicate versions are an error."""
    root = folder or Path(str(resources.files("schemas") / "sql"))
    found: dict[int, Migration] = {}
    for path in sorted(root.glob("*.sql")):
        match = _FILE_RE.match(path.name)
        if match is None:
            raise MigrationError(f"migration file name must be NNN_name.sql: {path.name}")
        version = int(match.group(1))
        if version in found:
            raise MigrationError(f"two migrations with version {version}")
        found[version] = Migration(version, match.group(2), path.read_text())
    return [found[v] for v in sorted(found)]


async def migrate(dsn: str, folder: Path | None = None) -> list[int]:
    """Apply pending migrations; return the versions applied. A failing one leaves the database as it was."""
    migrations = load_migrations(folder)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("SELECT pg_advisory_lock($1)", _LOCK_KEY)
        await conn.execute(
            """CREATE TABLE IF NOT EXISTS schema_migrations (
                   version integer PRIMARY KEY, name text NOT NULL, checksum text NOT NULL,
                   applied_at timestamptz NOT NULL DEFAULT now())"""
        )
        applied = {
            r["version"]: r["checksum"]
            for r in await conn.fetch("SELECT version, checksum FROM schema_migrations")
        }
        done: list[int] = []
        for m in migrations:
            if m.version in applied:
                if applied[m.version] != m.checksum:
                    raise MigrationError(f"migration {m.version}_{m.name} changed after it was applied")
                continue
            try:
                async with conn.transaction():
                    await conn.execute(m.sql)
                    await conn.execute(
                        "INSERT INTO schema_migrations (version, name, checksum) VALUES ($1, $2, $3)",
                        m.version,
                        m.name,
                        m.checksum,
                    )
            except asyncpg.PostgresError as exc:
                raise MigrationError(
                    f"migration {m.version}_{m.name} failed and was rolled back: {exc}"
                ) from exc
            log.info("applied migration %03d_%s", m.version, m.name)
            done.append(m.version)
        return done
    finally:
        try:
            await conn.execute("SELECT pg_advisory_unlock($1)", _LOCK_KEY)
        finally:
            await conn.close()
