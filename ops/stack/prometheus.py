"""Prometheus from Debian's package, scraping the local stack, with infra/prometheus/alerts.yml loaded."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Collection, Mapping
from pathlib import Path

import httpx

from lorafleet.config import PlatformSettings
from lorafleet.profile import DEV_TOKEN
from ops.stack import scrape
from ops.stack.paths import INFRA, log_dir, run_dir, service_dir
from ops.stack.process import ManagedProcess, wait_until

NAME = "prometheus"
RULES = INFRA / "prometheus" / "alerts.yml"
SCRAPE_INTERVAL_S = 5
RETENTION = "2d"  # a laptop's stack: recent history only


def process(settings: PlatformSettings) -> ManagedProcess:
    return ManagedProcess(NAME, run_dir(settings), log_dir(settings))


def targets_dir(settings: PlatformSettings) -> Path:
    """Where the stack and the autoscaler write the replicas' file_sd targets."""
    return service_dir(settings, NAME) / "targets"


def config_file(settings: PlatformSettings) -> Path:
    return service_dir(settings, NAME) / "prometheus.yml"


def address(settings: PlatformSettings) -> str:
    return f"http://127.0.0.1:{settings.prometheus_port}"


def binary() -> str:
    found = shutil.which("prometheus")
    if found is None:
        raise RuntimeError("prometheus not found: install Debian's prometheus package (make deps does)")
    return found


def ready(settings: PlatformSettings) -> bool:
    try:
        return httpx.get(f"{address(settings)}/-/ready", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def write_config(settings: PlatformSettings, env: Mapping[str, str], processes: Collection[str]) -> Path:
    """Render the scrape config for these processes at the ports env gives them; return its path."""
    targets_dir(settings).mkdir(parents=True, exist_ok=True)
    token = config_file(settings).with_name("service-token")
    token.touch(mode=0o600)
    token.write_text(env.get(scrape.TOKEN_ENV, DEV_TOKEN))  # the gateway's token, as its env gives it
    config = scrape.render(env, processes, RULES, targets_dir(settings), SCRAPE_INTERVAL_S, token)
    path = config_file(settings)
    path.write_text(json.dumps(config, indent=2))  # JSON is YAML: Prometheus reads it as is
    return path


def up(
    settings: PlatformSettings,
    timeout: float = 60.0,
    env: Mapping[str, str] | None = None,
    processes: Collection[str] | None = None,
) -> str:
    """Write the config (every stack process unless told which) and start Prometheus on loopback."""
    proc = process(settings)
    if proc.pid() is not None and ready(settings):
        return "already running"
    listed = processes if processes is not None else [listener.process for listener in scrape.LISTENERS]
    path = write_config(settings, env if env is not None else {**scrape.LOCAL_ENV, **os.environ}, listed)
    data = service_dir(settings, NAME) / "data"
    argv = [
        binary(),
        f"--config.file={path}",
        f"--storage.tsdb.path={data}",
        f"--storage.tsdb.retention.time={RETENTION}",
        f"--web.listen-address=127.0.0.1:{settings.prometheus_port}",
    ]
    if proc.pid() is None:
        proc.start(argv)
    if not wait_until(lambda: ready(settings) or proc.pid() is None, timeout) or proc.pid() is None:
        raise RuntimeError(f"Prometheus did not become ready; log {proc.log_file}:\n{proc.log_tail()}")
    return "started"


def down(settings: PlatformSettings) -> bool:
    return process(settings).stop()
