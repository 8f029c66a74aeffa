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
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from harness.ports import free_port
from harness.seed import Alias, ReadyAdapter, Seed, Tenant
from harness.spec import HttpReady, ProcessSpec, StackSpec, app_args
from harness.stack import private_stack
from lorafleet.config import PlatformSettings

REPO = Path(__file__).resolve().parents[1]
TENANT = "bench"
ADAPTER_ID = "bench-standin-v1"
ALIAS = "bench/standin:prod"
TOKEN = "gwbench-replica-token"
STOP_GRACE_S = 30.0  # a profiled gateway writes its stats on the way out


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
    keys: dict[str, str]  # every seeded tenant's API key


def _seed(others: tuple[Tenant, ...] = ()) -> Seed:
    """The bench tenant with limits no run reaches, its adapter row and alias; other tenants beside it."""
    no_weights = "sha256:" + hashlib.sha256(b"the stand-in serves no weights").hexdigest()
    return Seed(
        (Tenant(TENANT, 1_000_000.0, 2_000_000_000), *others),
        (ReadyAdapter(ADAPTER_ID, TENANT, no_weights, checksum=no_weights),),
        (Alias(ALIAS, TENANT, ADAPTER_ID),),
    )


def _pinned(cpus: tuple[int, ...] | None) -> tuple[str, ...]:
    return () if cpus is None else ("taskset", "-c", ",".join(map(str, cpus)))


def bench_spec(
    layout: Layout,
    token_rate: float,
    ttft_ms: float,
    profile: Path | None,
    others: tuple[Tenant, ...] = (),
    gateway_env: dict[str, str] | None = None,
) -> StackSpec:
    """The stand-in, then the gateway routing only to it, each pinned as the layout says."""
    run = uuid.uuid4().hex[:8]
    replica_id = f"gwbench-{run}"
    standin_port, gateway_port = free_port(), free_port()
    standin_args: tuple[str, ...] = (
        "bench",
        "standin",
        "--replica-id",
        replica_id,
        "--port",
        str(standin_port),
    )
    standin_args += ("--adapter", ADAPTER_ID, "--token-rate", str(token_rate), "--ttft-ms", str(ttft_ms))
    standin = ProcessSpec(
        "standin",
        standin_args,
        standin_port,
        ready=(HttpReady(f"http://127.0.0.1:{standin_port}/health", 60),),
        wrapper=_pinned(layout.standin),
        stop_grace_s=STOP_GRACE_S,
    )
    gateway_env = {**(gateway_env or {}), "LORAFLEET_GATEWAY_PUBLIC_PORT": str(gateway_port)}
    if profile is not None:
        gateway_env["LORAFLEET_GATEWAY_PROFILE_PATH"] = str(profile.resolve())
    gateway = ProcessSpec(
        "gateway",
        app_args("public-gateway"),
        gateway_port,
        gateway_env,
        ready=(HttpReady(f"http://127.0.0.1:{gateway_port}/ready", 60),),
        wrapper=_pinned(layout.gateway),
        stop_grace_s=STOP_GRACE_S,
    )
    return StackSpec(
        processes=(standin, gateway),
        database=f"gwbench_{run}",
        seed=_seed(others),
        prefix=replica_id,
        replica_token=TOKEN,
        env={"PYTHONPATH": str(REPO)},
    )


@contextlib.asynccontextmanager
async def bench_stack(
    layout: Layout,
    token_rate: float,
    ttft_ms: float,
    logs: Path,
    profile: Path | None = None,
    others: tuple[Tenant, ...] = (),
    gateway_env: dict[str, str] | None = None,
) -> AsyncIterator[Stack]:
    """Database, stand-in and gateway up and routing to each other; all of it gone afterwards.

    With profile, the gateway runs under cProfile and writes its stats there when it stops. Other tenants
    (with their keys in Stack.keys) and settings of the gateway's own may be given."""
    spec = bench_spec(layout, token_rate, ttft_ms, profile, others, gateway_env)
    async with private_stack(spec, PlatformSettings(), logs) as stack:
        standin, gateway = stack.procs["standin"], stack.procs["gateway"]
        assert standin.proc is not None and gateway.proc is not None
        key = stack.keys[TENANT]
        yield Stack(
            gateway.url, standin.url, spec.prefix, key, gateway.proc, standin.proc, layout, logs, stack.keys
        )
