"""`lorafleet db ...`: database commands."""

from __future__ import annotations

import asyncio

import typer

from lorafleet.config import get_settings
from lorafleet.db.migrate import migrate as run_migrations

app = typer.Typer(no_args_is_help=True)


@app.command()
def migrate() -> None:
    """Apply pending SQL migrations from schemas/sql in order."""
    applied = asyncio.run(run_migrations(get_settings().database_url))
    typer.echo(f"applied {len(applied)} migration(s): {applied}" if applied else "database is up to date")
