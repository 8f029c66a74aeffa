"""`lorafleet db ...`: database commands."""

from __future__ import annotations

import asyncio

import typer

from lorafleet.config import DatabaseLoginSettings, get_settings
from lorafleet.db.logins import ensure_logins, forget_replica
from lorafleet.db.migrate import migrate as run_migrations

app = typer.Typer(no_args_is_help=True)


@app.command()
def migrate() -> None:
    """Apply pending SQL migrations from schemas/sql in order."""
    applied = asyncio.run(run_migrations(get_settings().database_url))
    typer.echo(f"applied {len(applied)} migration(s): {applied}" if applied else "database is up to date")


@app.command()
def logins() -> None:
    """Make each LORAFLEET_DB_LOGIN_<PROCESS> URL's user a login of that process's role (migrate first);
    LORAFLEET_DATABASE_URL is the owner's, which may create roles."""
    wanted = DatabaseLoginSettings().logins()
    if not wanted:
        typer.echo("no LORAFLEET_DB_LOGIN_* set: nothing to do")
        return
    made = asyncio.run(ensure_logins(get_settings().database_url, wanted))
    for process, user in zip(wanted, made, strict=True):
        typer.echo(f"{process}: login {user}")


@app.command("forget-replica")
def forget_replica_cmd(replica_id: str) -> None:
    """Release a replica id whose identity key is lost (its volume was), so it can register again."""
    removed = asyncio.run(forget_replica(get_settings().database_url, replica_id))
    typer.echo(f"{replica_id}: {'released' if removed else 'not registered'}")
