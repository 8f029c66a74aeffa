"""docker-compose.yml as data: each service built from the project's image as a native process with exactly
the command and environment the file gives it (harness/deploy/network.py says what running containers
natively on one machine changes).

A container listens on the ports its settings (or its --port flag) name; natively each becomes a loopback
port of its own, set in the variable of that setting (a container's port is the process's setting, so the
variable states the moved listener), and every `<service>:<port>` in the file resolves there. A health
check's Python one-liner runs as written, on the moved ports.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import yaml  # type: ignore[import-untyped]
from pydantic_settings import BaseSettings

from gateway.config import GatewaySettings
from harness.deploy.k8s import process_of
from harness.deploy.network import LOOPBACK, Network, listen_locally
from harness.ports import free_port, free_ports
from harness.spec import CheckReady, ProcessSpec
from lorafleet.config import RelaySettings
from ops.autoscale.config import AutoscaleSettings
from placement_worker.config import PlacementSettings
from replica.config import ReplicaSettings
from stats_stream.config import StatsStreamSettings

# process -> the (settings class, port field, host field) of each listener it may open
LISTENERS: dict[str, tuple[tuple[type[BaseSettings], str, str], ...]] = {
    "relay": ((RelaySettings, "metrics_port", "metrics_host"),),
    "gateway": ((GatewaySettings, "internal_port", "internal_host"),),
    "public-gateway": (
        (GatewaySettings, "public_port", "public_host"),
        (GatewaySettings, "tenant_metrics_port", "tenant_metrics_host"),
    ),
    "registry-validator": ((GatewaySettings, "validator_metrics_port", "validator_metrics_host"),),
    "placement-worker": ((PlacementSettings, "metrics_port", "metrics_host"),),
    "stats-stream": ((StatsStreamSettings, "metrics_port", "metrics_host"),),
    "replica serve": ((ReplicaSettings, "port", "host"),),
}
# the autoscaler's replicas listen on a range of ports from these settings
PORT_RANGES = (("first_port", "max_replicas"), ("merged_first_port", "merged_max_replicas"))


def settings_of(cls: type[BaseSettings], env: Mapping[str, str]) -> Any:
    """cls as a process with exactly env (no other LORAFLEET_* variable) builds it."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LORAFLEET_")}
    with mock.patch.dict(os.environ, {**clean, **env}, clear=True):
        return cls()


def variable(cls: type[BaseSettings], name: str) -> str:
    return (str(cls.model_config.get("env_prefix", "")) + name).upper()


@dataclass
class Container:
    """A built service: its name, command, environment and its ports (container port -> loopback)."""

    name: str
    argv: tuple[str, ...]
    env: dict[str, str]
    ports: dict[int, int]
    healthcheck: list[str] | None


@dataclass
class Project:
    """The compose file's built services, run natively on one machine."""

    doc: dict[str, Any]
    network: Network
    work: Path
    base_env: Mapping[str, str] = field(default_factory=dict)
    # process -> variables the test sets over the file's (say why there)
    overrides: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    containers: dict[str, Container] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path, network: Network, work: Path, **kwargs: Any) -> Project:
        return cls(yaml.safe_load(path.read_text()), network, work, **kwargs)

    def service(self, name: str) -> dict[str, Any]:
        return dict(self.doc["services"][name])

    def built(self) -> list[str]:
        """The services built from the project (`build: .`), in the file's order."""
        return [n for n, s in self.doc["services"].items() if s.get("build") in (".", {"context": "."})]

    def volume(self, name: str) -> Path:
        folder = self.work / "volumes" / name
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def prepare(self) -> None:
        """Give every built service its loopback ports, so each name in the file resolves before any of
        them starts."""
        for name in self.built():
            spec = self.service(name)
            argv = tuple(str(a) for a in spec.get("command", []))
            env = {k: str(v) for k, v in (spec.get("environment") or {}).items()}
            ports: dict[int, int] = {}
            moved = dict(env)
            process = process_of(argv)
            for cls, port_field, host_field in LISTENERS.get(process, ()):
                settings = settings_of(cls, env)
                port = int(getattr(settings, port_field))
                if process == "replica serve" and "--port" in argv:
                    port = int(argv[argv.index("--port") + 1])
                if port:
                    ports[port] = free_port()
                    moved[variable(cls, port_field)] = str(port)  # the listener the container opens
                    moved.setdefault(variable(cls, host_field), str(getattr(settings, host_field)))
            if process == "autoscale":  # replica <index> of its own listens on <first port> + index
                settings = settings_of(AutoscaleSettings, env)
                for first, count in PORT_RANGES:
                    n = int(getattr(settings, count))
                    base, moved_base = int(getattr(settings, first)), free_ports(n)
                    ports |= {base + i: moved_base + i for i in range(n)}
                    moved[variable(AutoscaleSettings, first)] = str(base)
            for port, loopback in ports.items():
                self.network.add(name, port, loopback)
            self.containers[name] = Container(name, argv, moved, ports, _healthcheck(spec))

    def spec(self, name: str, probe_s: float = 180.0) -> ProcessSpec:
        """The service as a ProcessSpec, ready when its health check passes (if it has one)."""
        c = self.containers[name]
        mounts = [str(v).split(":") for v in self.service(name).get("volumes", [])]
        volumes = {inside: self.volume(volume) for volume, inside, *_ in mounts}
        argv = [self.network.rewrite(a, c.ports, volumes) for a in c.argv]
        for i in range(1, len(argv)):  # --port <a container port>
            if argv[i - 1] == "--port" and argv[i].isdigit() and int(argv[i]) in c.ports:
                argv[i] = str(c.ports[int(argv[i])])
        env = {k: self.network.rewrite(v, c.ports, volumes) for k, v in c.env.items()}
        # a listener on the container's own name (so that the others reach it) listens on loopback
        env = {k: LOOPBACK if k.endswith("_HOST") and v in self.containers else v for k, v in env.items()}
        env = listen_locally(env, c.ports)
        env = {**self.base_env, **env, **self.overrides.get(process_of(tuple(argv)), {})}
        probes: tuple[CheckReady, ...] = ()
        if c.healthcheck is not None:
            check = [self.network.rewrite(a, c.ports, volumes) for a in c.healthcheck]
            probes = (CheckReady(f"health check {check}", lambda: _passes(check), probe_s),)
        return ProcessSpec(name, tuple(argv), None, env, probes, log=name)


def _healthcheck(spec: Mapping[str, Any]) -> list[str] | None:
    """A service's health check as argv (CMD form, `python` the interpreter running the tests)."""
    test = (spec.get("healthcheck") or {}).get("test")
    if not test or test[0] != "CMD":
        return None
    argv = [str(a) for a in test[1:]]
    return [sys.executable, *argv[1:]] if argv[0] == "python" else argv


async def _passes(check: list[str]) -> bool:
    done = subprocess.run(check, capture_output=True, timeout=30)
    return done.returncode == 0


__all__ = ["LOOPBACK", "Container", "Project"]
