"""The local stack: backing services first, then the project's own processes, each from a table."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from lorafleet.config import PlatformSettings
from lorafleet.db.logins import ensure_logins
from lorafleet.db.migrate import migrate
from lorafleet.kafka import ensure_topics
from ops.autoscale import view as autoscale_view
from ops.kafka_acl_admin import apply_acls
from ops.stack import kafka, objectstore, postgres, prometheus, redis, supervisor
from ops.stack.env import database_env, dev_logins, kafka_env, process_env
from ops.stack.memory import format_bytes, rss_bytes, tree_rss_bytes
from ops.stack.paths import REPO_ROOT, log_dir, run_dir
from ops.stack.process import ManagedProcess, wait_until
from ops.stack.scrape import ReplicaTarget, write_replica_targets
from schemas import principals


@dataclass(frozen=True)
class Infra:
    """A backing service: how to start, stop and probe it."""

    name: str
    up: Callable[[PlatformSettings], str]
    down: Callable[[PlatformSettings], bool]
    ready: Callable[[PlatformSettings], bool]
    address: Callable[[PlatformSettings], str]
    pid: Callable[[PlatformSettings], int | None]


INFRA: tuple[Infra, ...] = (
    Infra("postgres", postgres.up, postgres.down, postgres.ready, lambda s: s.database_url, postgres.pid),
    Infra(
        "kafka",
        kafka.up,
        kafka.down,
        kafka.ready,
        lambda s: s.kafka_bootstrap,
        lambda s: kafka.process(s).pid(),
    ),
    Infra(
        "objectstore",
        objectstore.up,
        objectstore.down,
        objectstore.ready,
        lambda s: s.s3_endpoint,
        lambda s: objectstore.process(s).pid(),
    ),
    Infra("redis", redis.up, redis.down, redis.ready, redis.address, lambda s: redis.process(s).pid()),
    # last: it scrapes the others, and `down` stops it first
    Infra(
        "prometheus",
        prometheus.up,
        prometheus.down,
        prometheus.ready,
        prometheus.address,
        lambda s: prometheus.process(s).pid(),
    ),
)

AUTOSCALER = "autoscaler"

# The project's own long-running processes, as `lorafleet` sub-commands. Later issues add the gateway,
# placement worker, stats stream and replicas here.
APP_PROCESSES: dict[str, list[str]] = {
    "relay": ["relay"],
    "stats-stream": ["stats-stream"],
    "gateway": ["gateway"],
    "registry-validator": ["registry-validator"],
    "placement-worker": ["placement-worker"],
    "public-gateway": ["public-gateway"],
    "replica-0": ["replica", "serve", "--replica-id", "replica-0", "--port", "18100"],
    "replica-1": ["replica", "serve", "--replica-id", "replica-1", "--port", "18101"],
    # last, so `down` stops it before the replicas it started (replica-2, replica-3, ...)
    AUTOSCALER: ["autoscale", "--local"],
}


# Each app process's Kafka principal (schemas/principals.py); a name not listed is a replica.
APP_PRINCIPALS: dict[str, str] = {
    "relay": principals.RELAY,
    "stats-stream": principals.STATS_STREAM,
    "gateway": principals.GATEWAY,
    "registry-validator": principals.REGISTRY_VALIDATOR,
    "placement-worker": principals.PLACEMENT_WORKER,
    "public-gateway": principals.GATEWAY,
    AUTOSCALER: principals.AUTOSCALER,
}


# Each app process's database login (schemas/principals.py DATABASE_ROLES); a name not listed is a replica.
APP_DATABASE_LOGINS: dict[str, str] = {
    "relay": principals.RELAY,
    "stats-stream": principals.STATS_STREAM,
    "gateway": principals.GATEWAY,
    "registry-validator": principals.REGISTRY_VALIDATOR,
    "placement-worker": principals.PLACEMENT_WORKER,
    "public-gateway": principals.PUBLIC_GATEWAY,
    AUTOSCALER: principals.AUTOSCALER,
}


def app_envs(names: Sequence[str]) -> dict[str, dict[str, str]]:
    """Each named app process's own Kafka and database logins (a name not listed is a replica)."""
    return {
        name: {
            **kafka_env(APP_PRINCIPALS.get(name, principals.REPLICA)),
            **database_env(APP_DATABASE_LOGINS.get(name, principals.REPLICA)),
        }
        for name in names
    }


def stack_replicas() -> list[ReplicaTarget]:
    """The replicas of the process table (replica-0, replica-1) as scrape targets."""
    out = []
    for args in APP_PROCESSES.values():
        if args[:2] == ["replica", "serve"]:
            rid, port = args[args.index("--replica-id") + 1], int(args[args.index("--port") + 1])
            out.append(ReplicaTarget(rid, "127.0.0.1", port, "default"))
    return out


def app_process(settings: PlatformSettings, name: str) -> ManagedProcess:
    return ManagedProcess(name, run_dir(settings), log_dir(settings))


def infra_up(settings: PlatformSettings, report: Callable[[str], None]) -> None:
    for svc in INFRA:
        report(f"{svc.name}: {svc.up(settings)} ({svc.address(settings)})")
    # the local broker's admin; each process's database login with its dev password
    prepare(kafka.admin_settings(settings), report, dev_logins(settings.database_url))


def prepare(
    settings: PlatformSettings, report: Callable[[str], None], logins: Mapping[str, str] | None = None
) -> None:
    """Migrate the database, make the processes' logins (process -> its database URL), create the topics
    and the ACLs and the adapter bucket; idempotent. The settings' database role may create roles, and its
    Kafka login is a super user's (the admin)."""
    applied = asyncio.run(migrate(settings.database_url))
    report(f"migrations: {len(applied)} applied")
    if logins:
        made = asyncio.run(ensure_logins(settings.database_url, logins))
        report(f"database logins: {', '.join(made)}")
    created = asyncio.run(ensure_topics(settings))
    report(f"topics: {len(created)} created")
    if settings.kafka_security_protocol != "PLAINTEXT":
        report(f"kafka ACLs: {asyncio.run(apply_acls(settings))} bindings in place")
    objectstore.ensure_bucket(settings)
    report(f"bucket: {settings.s3_bucket}")


def app_commands(only: Sequence[str] = ()) -> dict[str, list[str]]:
    """The argv of each app process to run: all of them, or the ones named in only (in table order)."""
    unknown = sorted(set(only) - set(APP_PROCESSES))
    if unknown:
        raise ValueError(f"no app process named {', '.join(unknown)}; known: {', '.join(APP_PROCESSES)}")
    return {
        name: [sys.executable, "-m", "lorafleet.cli", *args]
        for name, args in APP_PROCESSES.items()
        if not only or name in only
    }


def supervisor_process(settings: PlatformSettings) -> ManagedProcess:
    return ManagedProcess(supervisor.NAME, run_dir(settings), log_dir(settings))


def apps_up(settings: PlatformSettings, report: Callable[[str], None], only: Sequence[str] = ()) -> None:
    """Start the supervisor, which starts the app processes and restarts any that dies."""
    names = list(app_commands(only))
    write_replica_targets(prometheus.targets_dir(settings), "stack", stack_replicas())
    sup = supervisor_process(settings)
    if sup.pid() is not None:
        report(f"{supervisor.NAME}: already running (pid {sup.pid()}); it restarts what dies")
        return
    argv = [sys.executable, "-m", "lorafleet.cli", "services", "supervise", *(f"--only={n}" for n in names)]
    pid = sup.start(argv, env=process_env(), cwd=REPO_ROOT)  # the children inherit its environment
    report(f"{supervisor.NAME}: started (pid {pid}, log {sup.log_file})")

    def all_started() -> bool:
        state = supervisor.read_state(settings)
        return all(state.get(n, {}).get("pid") for n in names)

    wait_until(all_started, 30.0)
    state = supervisor.read_state(settings)
    for name in names:
        report(f"{name}: pid {state.get(name, {}).get('pid')}, log {app_process(settings, name).log_file}")


def down(settings: PlatformSettings, report: Callable[[str], None]) -> None:
    # The supervisor first, so that nothing is restarted while the stack goes down; it stops its children.
    stopped = supervisor_process(settings).stop(timeout=60.0)
    report(f"{supervisor.NAME}: {'stopped' if stopped else 'not running'}")
    for name in reversed(list(APP_PROCESSES)):
        report(f"{name}: {'stopped' if app_process(settings, name).stop() else 'not running'}")
        if name == AUTOSCALER:
            autoscale_view.stop_replicas(settings, report)
    for targets in prometheus.targets_dir(settings).glob("*.json"):
        targets.unlink()  # nothing of the stack listens now
    for svc in reversed(INFRA):
        report(f"{svc.name}: {'stopped' if svc.down(settings) else 'not running'}")


def status(settings: PlatformSettings) -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = {}
    for svc in INFRA:
        pid = svc.pid(settings)
        out[svc.name] = {
            "healthy": svc.ready(settings),
            "address": svc.address(settings),
            "pid": pid,
            "rss_bytes": tree_rss_bytes(pid) if pid is not None else None,
        }
    sup = supervisor_process(settings).pid()
    # its own memory only: its children are listed below
    out[supervisor.NAME] = {
        "healthy": sup is not None,
        "pid": sup,
        "rss_bytes": rss_bytes(sup) if sup else None,
    }
    state = supervisor.read_state(settings)
    for name in APP_PROCESSES:
        pid = app_process(settings, name).pid()
        # the autoscaler's replicas are its children, each listed (and counted) under it
        memory = rss_bytes if name == AUTOSCALER else tree_rss_bytes
        rss = memory(pid) if pid is not None else None
        restarts = state.get(name, {}).get("restarts", 0)
        out[name] = {"healthy": pid is not None, "pid": pid, "rss_bytes": rss, "restarts": restarts}
    replicas = autoscale_view.replica_rows(settings)
    for row in replicas:
        replica_pid = row["pid"]
        row["rss_bytes"] = tree_rss_bytes(replica_pid) if isinstance(replica_pid, int) else None
    out[AUTOSCALER]["replicas"] = replicas
    return out


def status_lines(result: dict[str, dict[str, object]]) -> list[str]:
    """`services status` as text: one line per process with its resident memory, then the total."""
    lines, total = [], 0
    for name, info in result.items():
        mark = "healthy" if info["healthy"] else "DOWN"
        rss = info.get("rss_bytes")
        rss = rss if isinstance(rss, int) else None
        total += rss or 0
        detail = str(info.get("address") or f"pid {info.get('pid')}")
        if "restarts" in info:
            detail += f", restarts {info['restarts']}"
        lines.append(f"{name:18s} {mark:8s} {format_bytes(rss):>9s}  {detail}")
        replicas = info.get("replicas", [])
        assert isinstance(replicas, list)
        for r in replicas:
            status, mem = r["status"] or "no answer", format_bytes(r["rss_bytes"])
            total += r["rss_bytes"] or 0
            lines.append(f"  {r['replica_id']:16s} {status:8s} {mem:>9s}  port {r['port']} pid {r['pid']}")
    lines.append(f"{'total RSS':18s} {'':8s} {format_bytes(total):>9s}")
    return lines
