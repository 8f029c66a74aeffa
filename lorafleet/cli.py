"""The `lorafleet` command: one typer app that mounts each package's own sub-app."""

from __future__ import annotations

import importlib
import logging
import sys

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
}


def _mount(only: str | None = None) -> None:
    """Mount every sub-app, or just the one named (so `lorafleet services status` does not import torch).

    A sub-app that fails to import is a packaging error: it fails the command rather than vanishing.
    """
    for name, (module, attr, help_text) in SUBCOMMANDS.items():
        if only in (None, name):
            app.add_typer(getattr(importlib.import_module(module), attr), name=name, help=help_text)
    for name, (module, attr) in COMMANDS.items():
        if only in (None, name):
            app.command(name)(getattr(importlib.import_module(module), attr))


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # httpx logs every request at INFO: on the gateway that is a line per proxied request on the hot path
    logging.getLogger("httpx").setLevel(logging.WARNING)
    first = sys.argv[1] if len(sys.argv) > 1 else None
    _mount(first if first in SUBCOMMANDS or first in COMMANDS else None)
    app()


if __name__ == "__main__":
    main()
