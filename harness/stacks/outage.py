"""A control plane of its own for the outage tests: a private PostgreSQL cluster and Kafka broker on free
ports in a temp folder (started with ops.stack's own code), and the app processes under
`lorafleet services supervise`. The faults act on these private processes only, never the shared ones."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from harness.env import stack_env
from harness.ports import free_port
from harness.spec import HttpReady, ProcessSpec, StackSpec
from harness.stack import private_stack
from lorafleet.config import PlatformSettings
from lorafleet.db.logins import ensure_logins
from lorafleet.db.migrate import migrate
from lorafleet.kafka import ensure_topics
from lorafleet.pids import pid_alive
from ops.stack import kafka, postgres, supervisor
from ops.stack.env import dev_logins
from ops.stack.paths import REPO_ROOT, java_classpath

SERVICE_TOKEN = "outage-test-service-token"
APPS = ("relay", "gateway", "registry-validator", "placement-worker", "public-gateway")
PREFIX = "outage-"


@dataclass
class Stack:
    settings: PlatformSettings
    env: dict[str, str]
    internal_url: str
    public_url: str

    def postmaster_pid(self) -> int:
        pid_file = self.settings.data_path / "postgres" / "data" / "postmaster.pid"
        return int(pid_file.read_text().splitlines()[0])

    def app_pids(self) -> dict[str, int | None]:
        state = supervisor.read_state(self.settings)
        return {name: state.get(name, {}).get("pid") for name in APPS}  # type: ignore[misc]

    def restarts(self) -> dict[str, int]:
        state = supervisor.read_state(self.settings)
        return {name: int(state.get(name, {}).get("restarts", 0)) for name in APPS}  # type: ignore[call-overload]

    def all_running(self) -> bool:
        pids = self.app_pids()
        return all(p is not None and pid_alive(p) for p in pids.values())


def missing_local_infra() -> str | None:
    """Why a private PostgreSQL and Kafka can't start here, or None when they can. `make deps` installs both
    (Debian's postgresql, Maven Central's Kafka jars and Java) whether or not a Docker engine answers, so
    `make test` runs the outage tests on any CI runner; only a run that skipped `make deps` lacks them."""
    try:
        postgres._bin("initdb")
        kafka._java()
        java_classpath("kafka")
    except (RuntimeError, FileNotFoundError) as exc:
        return f"no local PostgreSQL or Kafka to fault ({exc}); `make test` installs them"
    return None


def _private_settings(base: Path, s3: PlatformSettings) -> PlatformSettings:
    pg_port, kafka_port, controller_port = free_port(), free_port(), free_port()
    return PlatformSettings(
        data_dir=base,
        postgres_port=pg_port,
        database_url=f"postgresql://lorafleet:lorafleet@127.0.0.1:{pg_port}/lorafleet",
        kafka_bootstrap=f"127.0.0.1:{kafka_port}",
        kafka_controller_port=controller_port,
        s3_endpoint=s3.s3_endpoint,
        s3_access_key=s3.s3_access_key,
        s3_secret_key=s3.s3_secret_key,
    )


def _env(settings: PlatformSettings, internal_port: int, public_port: int) -> dict[str, str]:
    """Over the base environment (the private services, the data folder, the prefix): the private ports,
    and tighter bounds than the defaults, so the short faults below show every path."""
    return {
        "LORAFLEET_POSTGRES_PORT": str(settings.postgres_port),
        "LORAFLEET_KAFKA_CONTROLLER_PORT": str(settings.kafka_controller_port),
        "LORAFLEET_DB_COMMAND_TIMEOUT_S": "3",
        "LORAFLEET_DB_STATEMENT_TIMEOUT_MS": "3000",
        "LORAFLEET_RETRY_MAX_S": "2",
        "LORAFLEET_RESTART_INITIAL_S": "0.5",
        "LORAFLEET_RELAY_POLL_INTERVAL_S": "0.1",
        "LORAFLEET_RELAY_METRICS_PORT": "0",
        "LORAFLEET_GATEWAY_VALIDATOR_METRICS_PORT": "0",
        "LORAFLEET_PLACEMENT_METRICS_PORT": "0",
        "LORAFLEET_PLACEMENT_TICK_S": "1",
        "LORAFLEET_GATEWAY_INTERNAL_PORT": str(internal_port),
        "LORAFLEET_GATEWAY_PUBLIC_PORT": str(public_port),
        "LORAFLEET_GATEWAY_SERVICE_TOKEN": SERVICE_TOKEN,
        "LORAFLEET_GATEWAY_KEY_CACHE_TTL_S": "1",
    }


def outage_spec(settings: PlatformSettings, internal_port: int, public_port: int) -> StackSpec:
    """The apps under `lorafleet services supervise` on the private services, ready once both gateways
    answer; its log and theirs under the data folder's logs."""
    service = {"Authorization": f"Bearer {SERVICE_TOKEN}"}
    supervise = ProcessSpec(
        "supervisor",
        ("services", "supervise", *(f"--only={a}" for a in APPS)),
        ready=(
            HttpReady(f"http://127.0.0.1:{public_port}/health", 120),
            HttpReady(f"http://127.0.0.1:{internal_port}/openapi.json", 60, service),
        ),
        stop_grace_s=40.0,
    )
    env = _env(settings, internal_port, public_port)
    return StackSpec(processes=(supervise,), prefix=PREFIX, data_dir=settings.data_path, env=env)


def _infra_up(settings: PlatformSettings) -> None:
    """As `services up` prepares the shared services: migrated, each process's own login, the topics."""
    postgres.up(settings)
    kafka.up(settings)
    asyncio.run(migrate(settings.database_url))
    asyncio.run(ensure_logins(settings.database_url, dev_logins(settings.database_url)))
    asyncio.run(ensure_topics(settings))


def _infra_down(settings: PlatformSettings) -> None:
    with contextlib.suppress(Exception):
        resume_postgres_tree(settings)
    with contextlib.suppress(Exception):
        postgres.down(settings)
    with contextlib.suppress(Exception):
        kafka.down(settings)


def postgres_tree(settings: PlatformSettings) -> list[int]:
    """The postmaster and every process it forked (backends, checkpointer, WAL writer...)."""
    pid_file = settings.data_path / "postgres" / "data" / "postmaster.pid"
    root = int(pid_file.read_text().splitlines()[0])
    found = [root]
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == root:
            found.append(int(proc.name))
    return found


def kill_broker(settings: PlatformSettings, gone_within_s: float = 15.0) -> None:
    """SIGKILL the private Kafka broker (no controlled shutdown, no flush) and wait until it is gone."""
    pid = kafka.process(settings).pid()
    if pid is None:
        raise RuntimeError("the private broker is not running: nothing to kill")
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + gone_within_s
    while pid_alive(pid):
        if time.monotonic() > deadline:
            raise RuntimeError(f"broker {pid} still alive {gone_within_s}s after SIGKILL")
        time.sleep(0.05)


def pause_postgres_tree(settings: PlatformSettings) -> list[int]:
    pids = postgres_tree(settings)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
    return pids


def resume_postgres_tree(settings: PlatformSettings) -> None:
    for pid in postgres_tree(settings):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


@contextlib.asynccontextmanager
async def private_infra(s3: PlatformSettings) -> AsyncIterator[PlatformSettings]:
    """A PostgreSQL cluster (migrated) and a Kafka broker (topics created) of their own, on free ports."""
    # Not pytest's tmp_path: PostgreSQL runs as the postgres user when we are root, and pytest's base
    # folder is private to us.
    base = Path(tempfile.mkdtemp(prefix="lorafleet-outage-"))
    base.chmod(0o755)
    settings = _private_settings(base, s3)
    try:
        await asyncio.to_thread(_infra_up, settings)
        yield settings
    finally:
        await asyncio.to_thread(_infra_down, settings)
        shutil.rmtree(base, ignore_errors=True)


def infra_env(settings: PlatformSettings) -> dict[str, str]:
    """The environment that points a process at private_infra's services."""
    return {**os.environ, **stack_env(outage_spec(settings, free_port(), free_port()), settings)}


@contextlib.asynccontextmanager
async def outage_stack(s3: PlatformSettings) -> AsyncIterator[Stack]:
    async with private_infra(s3) as settings:
        internal_port, public_port = free_port(), free_port()
        spec = outage_spec(settings, internal_port, public_port)
        async with private_stack(spec, settings, settings.data_path / "logs") as stack:
            yield Stack(
                settings,
                stack.env,
                f"http://127.0.0.1:{internal_port}",
                f"http://127.0.0.1:{public_port}",
            )


def tail(stack: Stack, name: str, lines: int = 40) -> str:
    path = stack.settings.data_path / "logs" / f"{name}.log"
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return ""


def status_json(stack: Stack) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "lorafleet.cli", "services", "status", "--json"],
        env=stack.env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return json.loads(out.stdout)
