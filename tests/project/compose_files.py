"""Read docker-compose.yml (and its GPU override) as Compose merges them, and each service's process."""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from typing import Any

import yaml

from tests.project.deploy_files import LISTENERS, process_of, resolve_cli, settings_from
from tests.project.project_files import ROOT

COMPOSE = ROOT / "docker-compose.yml"
GPU_OVERRIDE = ROOT / "docker-compose.gpu.yml"
ANCHOR_ENV = "x-lorafleet-env"


@functools.cache
def _load(path: str) -> dict[str, Any]:
    return yaml.safe_load((ROOT / path).read_text())


def compose() -> dict[str, Any]:
    return copy.deepcopy(_load(COMPOSE.name))


def gpu_override() -> dict[str, Any]:
    return copy.deepcopy(_load(GPU_OVERRIDE.name))


def merge(base: Any, override: Any) -> Any:
    """Compose's merge of an override file, for the mappings our override uses: keys merge, leaves replace."""
    if isinstance(base, dict) and isinstance(override, dict):
        out = dict(base)
        for key, value in override.items():
            out[key] = merge(base[key], value) if key in base else value
        return out
    return override


@dataclass(frozen=True)
class Service:
    name: str
    spec: dict[str, Any]

    @property
    def built(self) -> bool:
        return self.spec.get("build") in (".", {"context": "."})

    @property
    def argv(self) -> list[str]:
        return list(self.spec.get("command", []))

    @property
    def process(self) -> str:
        return process_of(self.argv)

    def env(self) -> dict[str, str]:
        return {k: str(v) for k, v in (self.spec.get("environment") or {}).items()}

    def own_env(self) -> dict[str, str]:
        """The variables this service sets beyond the shared anchor (or to another value)."""
        shared = {k: str(v) for k, v in compose()[ANCHOR_ENV].items()}
        return {k: v for k, v in self.env().items() if shared.get(k) != v}

    def listen_port(self) -> int:
        """The port the service's process listens on: its command's --port, else its settings."""
        listener = LISTENERS[self.process]
        flag = resolve_cli(self.argv).get("port")
        return int(flag or getattr(settings_from(listener.settings, self.env()), listener.port))

    def one_shot(self) -> bool:
        return self.built and "restart" not in self.spec


def services(doc: dict[str, Any] | None = None) -> dict[str, Service]:
    doc = doc if doc is not None else compose()
    return {name: Service(name, spec) for name, spec in doc["services"].items()}


def built() -> dict[str, Service]:
    return {name: s for name, s in services().items() if s.built}
