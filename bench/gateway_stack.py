"""The processes `lorafleet bench gateway` measures: the stand-in replica and the real public gateway.

A throwaway database (migrated, then dropped) holds the bench tenant with limits no run reaches, its API
key, one ready adapter row and its alias, so keys and aliases are read from PostgreSQL as in production.
The stand-in and the gateway run as their own processes, pinned with taskset to the cores of the layout;
the gateway routes only to replicas with this run's id prefix, found through replica.state on Kafka.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from gateway.tenants import create_key, create_tenant
from harness.databases import create_database, drop_database
from harness.ports import free_port
from harness.processes import stop, wait_http
from harness.seed import ReadyAdapter, insert_alias, insert_ready_adapters
from lorafleet.config import PlatformSettings
from lorafleet.db.migrate import migrate
from lorafleet.profile import DEV_PROFILE_ENV

REPO = Path(__file__).resolve().parents[1]
TENANT = "bench"
ADAPTER_ID = "bench-standin-v1"
ALIAS = "bench/standin:prod"
TOKEN = "gwbench-replica-token"


@dataclass(frozen=True)
class Layout:
    """Which CPUs each process may run on (None: not pinned)."""

    gateway: tuple[int, ...] | None
    standin: tuple[int, ...] | None
    load_generator: tuple[int, ...] | None

    def describe(self) -> dict[str, object]:
        roles = {"gateway": self.gateway, "standin": self.standin, "load_generator": self.load_generator}
        by_cpu: dict[int, list[str]] = {}
        for role, cpus in roles.items():
            for cpu in cpus or ():
                by_cpu.setdefault(cpu, []).append(role)
        return {
            "pinned_with": "taskset -c (load generator: sched_setaffinity on itself)",
            "cpus": {role: list(cpus) if cpus is not None else "unpinned" for role, cpus in roles.items()},
            "shared_cpus": {str(cpu): names for cpu, names in sorted(by_cpu.items()) if len(names) > 1},
            "note": "other processes on the machine are not pinned away from these cpus",
        }


def _one_cpu(cpus: list[int]) -> Layout:
    return Layout((cpus[0],), (cpus[0],), (cpus[0],))


def _two_cpus(cpus: list[int]) -> Layout:
    # the gateway gets a core of its own; the two ends of the measurement share the other
    return Layout((cpus[1],), (cpus[0],), (cpus[0],))


def _three_cpus(cpus: list[int]) -> Layout:
    return Layout((cpus[0],), (cpus[1],), (cpus[2],))


LAYOUTS = {1: _one_cpu, 2: _two_cpus, 3: _three_cpus}


def pick_layout(pin: bool) -> Layout:
    """The layout for the CPUs this process may use; unpinned when asked or when taskset is missing."""
    cpus = sorted(os.sched_getaffinity(0))
    if not pin or shutil.which("taskset") is None:
        return Layout(None, None, None)
    return LAYOUTS[min(3, len(cpus))](cpus)


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process so far (all its threads), from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Stack:
    gateway_url: str
    standin_url: str
    replica_id: str
    api_key: str
    gateway: subprocess.Popen
    standin: subprocess.Popen
    layout: Layout
    logs: Path


async def _seed(database_url: str) -> str:
    """The bench tenant, its adapter row and alias; returns a new API key."""
    await migrate(database_url)
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=1)
    try:
        await create_tenant(pool, TENANT, 1_000_000.0, 2_000_000_000)
        no_weights = "sha256:" + hashlib.sha256(b"the stand-in serves no weights").hexdigest()
        await insert_ready_adapters(pool, [ReadyAdapter(ADAPTER_ID, TENANT, no_weights, checksum=no_weights)])
        await insert_alias(pool, ALIAS, TENANT, ADAPTER_ID)
        return (await create_key(pool, TENANT)).secret
    finally:
        await pool.close()


def _pinned(cpus: tuple[int, ...] | None, cmd: list[str]) -> list[str]:
    return cmd if cpus is None else ["taskset", "-c", ",".join(map(str, cpus)), *cmd]


def _start(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(cmd, env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)


@contextlib.asynccontextmanager
async def bench_stack(
    layout: Layout, token_rate: float, ttft_ms: float, logs: Path, profile: Path | None = None
) -> AsyncIterator[Stack]:
    """Database, stand-in and gateway up and routing to each other; all of it gone afterwards.

    With profile, the gateway runs under cProfile and writes its stats there when it stops."""
    platform = PlatformSettings()
    run = uuid.uuid4().hex[:8]
    name = f"gwbench_{run}"
    database_url = await create_database(platform.database_url, name)
    logs.mkdir(parents=True, exist_ok=True)
    replica_id = f"gwbench-{run}"
    standin_port, gateway_port = free_port(), free_port()
    env = {
        **os.environ,
        **DEV_PROFILE_ENV,  # a bench stack runs on dev tokens
        "PYTHONPATH": str(REPO),
        "LORAFLEET_DATABASE_URL": database_url,
        "LORAFLEET_GATEWAY_PUBLIC_PORT": str(gateway_port),
        "LORAFLEET_GATEWAY_REPLICA_SERVICE_TOKEN": TOKEN,
        "LORAFLEET_GATEWAY_REPLICA_ID_PREFIX": replica_id,
        "LORAFLEET_REPLICA_SERVICE_TOKEN": TOKEN,
    }
    if profile is not None:
        env["LORAFLEET_GATEWAY_PROFILE_PATH"] = str(profile.resolve())
    py = [sys.executable, "-m", "lorafleet.cli"]
    standin_cmd = [*py, "bench", "standin", "--replica-id", replica_id, "--port", str(standin_port)]
    standin_cmd += ["--adapter", ADAPTER_ID, "--token-rate", str(token_rate), "--ttft-ms", str(ttft_ms)]
    procs: list[subprocess.Popen] = []
    try:
        key = await _seed(database_url)
        standin = _start(_pinned(layout.standin, standin_cmd), env, logs / "standin.log")
        procs.append(standin)
        gateway = _start(_pinned(layout.gateway, [*py, "public-gateway"]), env, logs / "gateway.log")
        procs.append(gateway)
        standin_url, gateway_url = f"http://127.0.0.1:{standin_port}", f"http://127.0.0.1:{gateway_port}"
        await wait_http(f"{standin_url}/health", 60, standin)
        await wait_http(f"{gateway_url}/ready", 60, gateway)
        yield Stack(gateway_url, standin_url, replica_id, key, gateway, standin, layout, logs)
    finally:
        for proc in reversed(procs):
            stop(proc, grace_s=30)  # a profiled gateway writes its stats on the way out
        await drop_database(platform.database_url, name)
