"""`lorafleet services up|init|down|status`: the local stack on loopback, or set-up of one elsewhere."""

from __future__ import annotations

import json

import typer

from lorafleet.config import DatabaseLoginSettings, get_settings
from lorafleet.profile import object_store_keys, refuse_dev_tokens, url_password
from ops.stack import stack, supervisor
from ops.stack.paths import REPO_ROOT

app = typer.Typer(no_args_is_help=True)


ONLY_HELP = "Only this app process (repeatable); default: all of them."


@app.command()
def up(
    infra_only: bool = typer.Option(False, "--infra-only", help="Only Kafka, PostgreSQL, S3 and Redis."),
    only: list[str] = typer.Option([], "--only", help=ONLY_HELP),
) -> None:
    """Start Kafka, PostgreSQL, S3 and Redis, migrate, create topics, then the supervised apps."""
    settings = get_settings()
    stack.app_commands(only)  # an unknown name fails before anything starts
    stack.infra_up(settings, typer.echo)
    if not infra_only:
        stack.apps_up(settings, typer.echo, only)


@app.command()
def supervise(only: list[str] = typer.Option([], "--only", help=ONLY_HELP)) -> None:
    """Run the app processes and restart any that dies, with backoff (what `up` starts in the background)."""
    commands = stack.app_commands(only)
    supervisor.supervise(get_settings(), commands, REPO_ROOT, stack.app_envs(list(commands)))


@app.command()
def init() -> None:
    """Migrate, make the processes' database logins (LORAFLEET_DB_LOGIN_<PROCESS>), create the topics, the
    Kafka ACLs and the bucket on services that run elsewhere (containers, Kubernetes), as the database owner
    (LORAFLEET_DATABASE_URL) and the Kafka admin (LORAFLEET_KAFKA_USERNAME, LORAFLEET_KAFKA_PASSWORD).

    Outside the dev profile it refuses, before it changes anything, a login it would make with a dev
    password or none, the object store's dev keys, and a dev Kafka password. The owner's password is the
    database server's own, not one this project ships or makes, so it is not checked."""
    settings = get_settings()
    logins = DatabaseLoginSettings().logins()
    login_passwords = {
        f"LORAFLEET_DB_LOGIN_{p.upper().replace('-', '_')}": url_password(u) for p, u in logins.items()
    }
    refuse_dev_tokens(
        settings, "services init", object_store_keys(settings) | login_passwords, database_url=False
    )
    stack.prepare(settings, typer.echo, logins)


@app.command()
def down() -> None:
    """Stop every process this project started (by pid), app processes first."""
    stack.down(get_settings(), typer.echo)


@app.command()
def status(as_json: bool = typer.Option(False, "--json")) -> None:
    """Say whether each service answers; exit 1 if any does not."""
    result = stack.status(get_settings())
    if as_json:
        typer.echo(json.dumps(result, indent=2, default=str))
    else:
        for line in stack.status_lines(result):
            typer.echo(line)
    if not all(info["healthy"] for info in result.values()):
        raise typer.Exit(1)
