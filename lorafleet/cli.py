"""The `lorafleet` command: one typer app that mounts each package's own sub-app."""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Callable
from typing import Any

import typer

app = typer.Typer(no_args_is_help=True, help="lorafleet: serve many LoRA adapters on one shared base model.")


@app.callback()
def _root() -> None:
    """lorafleet: serve many LoRA adapters on one shared base model."""
    # A callback keeps `lorafleet` a command group even when only one sub-command is mounted.


# name -> (module, attribute, help). Each package owns its commands; this file only mounts them.
SUBCOMMANDS: dict[str, tuple[str, str, str]] = {
    "services": (
        "ops.stack.cli",
        "app",
        "Start, stop and inspect the local Kafka, PostgreSQL, S3 and Redis.",
    ),
    "db": ("lorafleet.db.cli", "app", "Database migrations."),
    "model": ("lorafleet.model.cli", "app", "Prepare and inspect base models."),
    "replica": ("replica.cli", "app", "Run a replica (inference engine + adapter cache)."),
    "bench": ("bench.cli", "app", "Benchmarks that print JSON."),
    "canary": ("canary.cli", "app", "Canary adapters for the tenant-isolation checks."),
    "adapters": ("gateway.registry.cli", "adapters_app", "Register and list adapter versions."),
    "alias": ("gateway.registry.cli", "alias_app", "Deploy, roll back and list aliases."),
    "tenants": ("gateway.registry.cli", "tenants_app", "Create and list tenants (with their rate limits)."),
    "keys": ("gateway.registry.cli", "keys_app", "Issue, list and revoke tenants' API keys."),
    "report": ("ops.report_cli", "app", "Turn a JSON report into one HTML page."),
    "profile": ("sim.profile_cli", "app", "Replica sizing profiles: production (the brief's) and local."),
    "console": ("bench.console_screenshots", "app", "The web console: screenshots of a running stack."),
}

# Single commands that are a whole process each.
COMMANDS: dict[str, tuple[str, str]] = {
    "relay": ("relay.main", "relay"),
    "dead-letters": ("ops.dead_letters_cli", "dead_letters"),
    "gateway": ("gateway.registry.app", "serve"),
    "public-gateway": ("gateway.public.app", "serve_public"),
    "demo": ("demo.cli", "demo"),
    "registry-validator": ("gateway.registry.validator.main", "registry_validator"),
    "placement-worker": ("placement_worker.main", "placement_worker"),
    "stats-stream": ("stats_stream.cli", "stats_stream"),
    "stats": ("stats_stream.cli", "stats"),
    "autoscale": ("ops.autoscale.cli", "autoscale"),
    "simulate": ("sim.cli", "simulate_cmd"),
    "loadtest": ("loadtest.cli", "loadtest"),
    "loadtest-noisy": ("loadtest.noisy_cli", "noisy_neighbour"),
    "config-reference": ("ops.config_reference", "config_reference"),
}


# Packages that are tools rather than services: an installation may leave them out (the Docker image ships
# only what its services and deployment commands run), so their commands are listed as unavailable there.
TOOL_PACKAGES = frozenset({"ops", "demo", "harness", "bench", "canary", "sim", "loadtest", "scripts"})


def _load(module: str, attr: str) -> Any:
    """The command object, or the ImportError of a tool that this installation lacks.

    A service that fails to import is a packaging error: it fails the command rather than vanishing."""
    try:
        return getattr(importlib.import_module(module), attr)
    except ImportError as err:
        if module.split(".")[0] not in TOOL_PACKAGES:
            raise
        return err


def _unavailable(name: str, err: ImportError) -> Callable[[typer.Context], None]:
    def command(ctx: typer.Context) -> None:
        typer.echo(f"lorafleet {name} is not available in this installation: {err}", err=True)
        raise typer.Exit(2)

    return command


def _mount(only: str | None = None) -> None:
    """Mount every sub-app, or just the one named (so `lorafleet services status` does not import torch)."""
    absent = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}
    tables = {
        **{n: (m, a, h) for n, (m, a, h) in SUBCOMMANDS.items()},
        **{n: (m, a, None) for n, (m, a) in COMMANDS.items()},
    }
    for name, (module, attr, help_text) in tables.items():
        if only not in (None, name):
            continue
        loaded = _load(module, attr)
        if isinstance(loaded, ImportError):
            note = f"(not available here: {loaded})"
            app.command(name, help=note, context_settings=absent)(_unavailable(name, loaded))
        elif name in SUBCOMMANDS:
            app.add_typer(loaded, name=name, help=help_text)
        else:
            app.command(name)(loaded)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # httpx logs every request at INFO: on the gateway that is a line per proxied request on the hot path
    logging.getLogger("httpx").setLevel(logging.WARNING)
    first = sys.argv[1] if len(sys.argv) > 1 else None
    _mount(first if first in SUBCOMMANDS or first in COMMANDS else None)
    app()


if __name__ == "__main__":
    main()
