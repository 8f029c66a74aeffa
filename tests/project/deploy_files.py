"""What the deployment files are checked against: the settings classes, the CLI and each process's listener.

A container's `LORAFLEET_*` variable must be a field of a settings class its process reads, its command must
resolve in the real `lorafleet` typer app, and the port it exposes must be the one its settings make it
listen on. Renaming a setting, a command or a port breaks these checks, not a deployment.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TypeVar
from unittest import mock

import typer
import typer.core
from pydantic_settings import BaseSettings

from gateway.config import GatewaySettings
from lorafleet.config import DatabaseLoginSettings, PlatformSettings, RelaySettings
from ops.autoscale.config import AutoscaleSettings
from placement_worker.config import PlacementSettings
from replica.config import ReplicaSettings
from schemas import principals
from stats_stream.config import StatsStreamSettings

ALL_SETTINGS: tuple[type[BaseSettings], ...] = (
    PlatformSettings,
    DatabaseLoginSettings,
    RelaySettings,
    GatewaySettings,
    PlacementSettings,
    StatsStreamSettings,
    ReplicaSettings,
    AutoscaleSettings,
)

# process (first words of its command) -> the settings classes it reads
PROCESS_SETTINGS: dict[str, tuple[type[BaseSettings], ...]] = {
    "relay": (PlatformSettings, RelaySettings),
    "gateway": (PlatformSettings, GatewaySettings),
    "public-gateway": (PlatformSettings, GatewaySettings),
    "registry-validator": (PlatformSettings, GatewaySettings),
    "placement-worker": (PlatformSettings, PlacementSettings),
    "stats-stream": (PlatformSettings, StatsStreamSettings),
    "replica serve": (PlatformSettings, ReplicaSettings),
    # its replica processes inherit its environment
    "autoscale": (PlatformSettings, AutoscaleSettings, ReplicaSettings),
    "demo": (PlatformSettings, GatewaySettings),
    "services init": (PlatformSettings, DatabaseLoginSettings),
    "model prepare": (PlatformSettings,),
}

# The Kafka principal each Kafka-client process logs in as (schemas/principals.py); `services init` creates
# the topics and the ACLs, so it is the admin.
KAFKA_PRINCIPALS: dict[str, str] = {
    "relay": principals.RELAY,
    "gateway": principals.GATEWAY,
    "public-gateway": principals.GATEWAY,
    "registry-validator": principals.REGISTRY_VALIDATOR,
    "placement-worker": principals.PLACEMENT_WORKER,
    "stats-stream": principals.STATS_STREAM,
    "replica serve": principals.REPLICA,
    "autoscale": principals.AUTOSCALER,
    "services init": principals.ADMIN,
}
NO_KAFKA: set[str] = {"model prepare", "demo"}  # processes that never open a Kafka client


@dataclass(frozen=True)
class Listener:
    """Where a process listens: the settings class and its port and host fields (None: all interfaces)."""

    settings: type[BaseSettings]
    port: str
    host: str | None


LISTENERS: dict[str, Listener] = {
    "relay": Listener(RelaySettings, "metrics_port", "metrics_host"),
    "gateway": Listener(GatewaySettings, "internal_port", "internal_host"),
    "public-gateway": Listener(GatewaySettings, "public_port", "public_host"),
    "registry-validator": Listener(GatewaySettings, "validator_metrics_port", "validator_metrics_host"),
    "placement-worker": Listener(PlacementSettings, "metrics_port", "metrics_host"),
    "stats-stream": Listener(StatsStreamSettings, "metrics_port", "metrics_host"),
    "replica serve": Listener(ReplicaSettings, "port", "host"),
}


def env_names(classes: Iterable[type[BaseSettings]]) -> set[str]:
    """Every variable the classes read: env prefix + field name, upper case (nested settings excluded)."""
    names: set[str] = set()
    for cls in classes:
        prefix = str(cls.model_config.get("env_prefix", ""))
        for name, field in cls.model_fields.items():
            nested = isinstance(field.annotation, type) and issubclass(field.annotation, BaseSettings)
            if not nested:
                names.add((prefix + name).upper())
    return names


S = TypeVar("S", bound=BaseSettings)


def settings_from(cls: type[S], env: dict[str, str]) -> S:
    """The settings a process with exactly this LORAFLEET_* environment builds (values are validated)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LORAFLEET_")}
    with mock.patch.dict(os.environ, {**clean, **env}, clear=True):
        return cls()


def process_of(argv: list[str]) -> str:
    """The PROCESS_SETTINGS key of a `lorafleet` command line: the command, or group and sub-command."""
    from lorafleet.cli import SUBCOMMANDS

    if not argv:
        return ""
    return " ".join(argv[:2]) if argv[0] in SUBCOMMANDS else argv[0]


class UnknownCommand(Exception):
    """A command line the `lorafleet` app does not resolve."""


def resolve_cli(argv: list[str]) -> dict[str, Any]:
    """Parse argv with the real `lorafleet` app (mounted as `main()` mounts it): the parameters it gets.

    Unknown options and bad values raise typer's own usage errors (TyperException), unknown commands
    UnknownCommand.
    """
    from lorafleet.cli import COMMANDS, SUBCOMMANDS

    root = typer.Typer()

    @root.callback()
    def _root() -> None:
        """lorafleet"""

    name = argv[0]
    if name in SUBCOMMANDS:
        module, attr, _help = SUBCOMMANDS[name]
        root.add_typer(getattr(importlib.import_module(module), attr), name=name)
    elif name in COMMANDS:
        module, attr = COMMANDS[name]
        root.command(name)(getattr(importlib.import_module(module), attr))
    else:
        raise UnknownCommand(f"no lorafleet command {name!r}")
    command = typer.main.get_command(root)
    args = list(argv)
    while isinstance(command, typer.core.TyperGroup):
        if not args:
            raise UnknownCommand(f"{argv}: a command group needs a sub-command")
        sub = command.get_command(typer.Context(command), args[0])
        if sub is None:
            raise UnknownCommand(f"{argv}: no sub-command {args[0]!r}")
        command, args = sub, args[1:]
    return dict(command.make_context(command.name or name, args).params)
