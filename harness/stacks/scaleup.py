"""A small real stack for scale-up runs, isolated from any other stack on the same Kafka and PostgreSQL.

Its own database (migrated, one tenant with a key, ready adapters with aliases), replica ids with a run
prefix (`as<run>-<index>`) that its gateway, placement worker and stats stream alone count, its own fleet
name, data folder and ports. Processes: replica 0 (not the autoscaler's), the stats stream with short
windows, the relay, the placement worker, the autoscaler, and with `gateway=True` the public gateway.
Every process is started and stopped here by its own pid.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import httpx
from aiokafka import TopicPartition

from gateway.tenants import create_key, create_tenant
from harness.adapters import make_peft_adapters
from harness.databases import create_database, drop_database
from harness.ports import free_ports
from harness.seed import ReadyAdapter, insert_alias, insert_ready_adapters
from lorafleet.config import PlatformSettings
from lorafleet.db.migrate import migrate
from lorafleet.kafka import make_consumer
from lorafleet.model.base_hash import base_model_hash
from lorafleet.model.prepare import ensure_default_model
from lorafleet.profile import DEV_PROFILE_ENV
from ops.autoscale.records import Records
from schemas import topics
from schemas.replica_api import StateResponse
from schemas.topics import Topic

REPO = Path(__file__).resolve().parents[1]
TOKEN = "scaleup-replica-token"
TENANT = "acme"
ADAPTERS = {"acme-scale-a": "acme/scale-a:prod", "acme-scale-b": "acme/scale-b:prod"}


@dataclass(frozen=True)
class ScaleupConfig:
    """The thresholds and timings of one run (short windows: a run takes about a minute)."""

    queue_per_replica: float = 3.0  # the stats stream's per-replica queue threshold
    window_s: float = 2.0
    max_num_seqs: int = 2  # rows per replica: requests beyond them queue
    unmanaged: int = 1  # replica 0 is started here, not by the autoscaler
    max_replicas: int = 2
    stats_min_replicas: int = 1  # the signal's floor; above `unmanaged` the autoscaler starts one at once
    cooldown_s: float = 5.0
    scale_down_windows: int = 60  # the signal's hysteresis: no scale-down within a run
    start_timeout_s: float = 150.0
    gateway: bool = True
    env: Mapping[str, str] = field(default_factory=dict)  # overrides of the processes' environment
    adapters: Mapping[str, str] = field(default_factory=lambda: dict(ADAPTERS))  # adapter id -> its alias
    run: str | None = None  # the run id (replica ids are as<run>-<index>); None: a fresh random one


class Proc:
    """One process of the stack, logging to its own file."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.name, self.argv, self.env, self.log = name, argv, env, log
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                self.argv, env=self.env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT
            )

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill(self) -> None:
        if self.alive:
            assert self.popen is not None
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(10)

    def stop(self, timeout: float = 15.0) -> None:
        if not self.alive:
            return
        assert self.popen is not None
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_bytes().decode(errors="replace")[-chars:]
        except FileNotFoundError:
            return ""


def lorafleet(*args: str) -> list[str]:
    return [sys.executable, "-m", "lorafleet.cli", *args]


@dataclass
class ScaleupStack:
    run: str
    cfg: ScaleupConfig
    work: Path
    env: dict[str, str]
    platform: PlatformSettings  # this stack's data folder and database
    first_port: int
    gateway_url: str
    procs: dict[str, Proc] = field(default_factory=dict)
    keys: dict[str, str] = field(default_factory=dict)  # tenant -> API key

    @property
    def key(self) -> str:
        """The API key of tenant acme, else of the first tenant seeded."""
        return self.keys.get(TENANT) or next(iter(self.keys.values()))

    @property
    def prefix(self) -> str:
        return f"as{self.run}-"

    @property
    def fleet(self) -> str:
        return f"fleet-{self.run}"

    def replica_id(self, index: int) -> str:
        return f"{self.prefix}{index}"

    def replica_url(self, index: int) -> str:
        return f"http://127.0.0.1:{self.first_port + index}"

    def records(self) -> Records:
        return Records(self.platform, self.prefix, self.first_port)

    def autoscaler(self, label: str = "") -> Proc:
        """A fresh autoscaler process handle (the old one may have been killed), logging to its own file."""
        log = self.work / f"autoscaler{'-' + label if label else ''}.log"
        proc = Proc("autoscaler", lorafleet("autoscale", "--local"), self.env, log)
        self.procs["autoscaler"] = proc
        return proc

    def start_replica(self, index: int) -> Proc:
        """Start replica `index` here, not through the autoscaler (an unmanaged one beyond replica 0)."""
        argv = [
            "replica",
            "serve",
            "--replica-id",
            self.replica_id(index),
            "--port",
            str(self.first_port + index),
        ]
        name = f"replica-{index}"
        proc = Proc(name, lorafleet(*argv), self.env, self.work / f"{name}.log")
        self.procs[name] = proc
        proc.start()
        return proc

    async def all_ready(self, count: int) -> bool:
        """Replicas 0..count-1 all answer their state route with status ready."""
        states = [await self.state(i) for i in range(count)]
        return all(s is not None and s.status == "ready" for s in states)

    def replica_processes(self) -> list[int]:
        """pids of every live process serving one of this stack's replica ids, found in /proc."""
        out = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if stat.rsplit(")", 1)[-1].split()[0] == "Z":
                continue
            if b"--replica-id" in argv and argv[argv.index(b"--replica-id") + 1].startswith(
                self.prefix.encode()
            ):
                out.append(int(entry.name))
        return sorted(out)

    async def state(self, index: int) -> StateResponse | None:
        url = f"{self.replica_url(index)}/internal/replicas/{self.replica_id(index)}/state"
        try:
            async with httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}) as c:
                resp = await c.get(url, timeout=2.0)
            return StateResponse.model_validate_json(resp.content) if resp.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None

    def tails(self) -> str:
        logs = sorted(self.work.glob("*.log")) + sorted((self.work / "data" / "logs").glob("*.log"))
        return "\n".join(f"--- {p.name}\n{p.read_bytes().decode(errors='replace')[-2500:]}" for p in logs)


async def wait_for(check: Callable[[], object], timeout: float, what: str, stack: ScaleupStack) -> None:
    """Poll an (async) check until it is truthy; on timeout raise with every log's tail."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not within {timeout:.0f}s\n{stack.tails()}")
        await asyncio.sleep(0.2)


def new_run_id() -> str:
    """A fresh run id: the stack's database, fleet, groups and replica ids all carry it."""
    return uuid.uuid4().hex[:6]


async def _seed(database_url: str, base_hash: str, adapters: Mapping[str, str]) -> dict[str, str]:
    """Migrate, then each alias's tenant (the part before its "/") with a key, its adapter and the alias."""
    await migrate(database_url)
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    try:
        tenant_of = {adapter_id: alias.split("/", 1)[0] for adapter_id, alias in adapters.items()}
        keys = {}
        for tenant in dict.fromkeys(tenant_of.values()):
            await create_tenant(pool, tenant, 1000, 10_000_000)
            keys[tenant] = (await create_key(pool, tenant)).secret
        await insert_ready_adapters(pool, [ReadyAdapter(a, t, base_hash) for a, t in tenant_of.items()])
        for adapter_id, alias in adapters.items():
            await insert_alias(pool, alias, tenant_of[adapter_id], adapter_id)
        return keys
    finally:
        await pool.close()


async def start_groups_at_end(platform: PlatformSettings, groups: dict[str, tuple[Topic, ...]]) -> None:
    """Commit each new consumer group at its topics' end: a fresh worker skips every other run's history."""
    for group, names in groups.items():
        consumer = make_consumer(platform, group_id=group)
        await consumer.start()
        try:
            tps = [TopicPartition(t.name, p) for t in names for p in range(t.partitions)]
            consumer.assign(tps)
            ends = await consumer.end_offsets(tps)
            await consumer.commit({tp: offset for tp, offset in ends.items()})
        finally:
            await consumer.stop()


def _env(
    platform: PlatformSettings, cfg: ScaleupConfig, run: str, work: Path, database_url: str, first_port: int
) -> dict[str, str]:
    model_dir = ensure_default_model()
    prefix, ports = f"as{run}-", first_port + cfg.max_replicas + 1  # the block's ports after the replicas'
    return {
        **os.environ,
        **DEV_PROFILE_ENV,  # a bench stack runs on dev tokens
        "LORAFLEET_DATA_DIR": str(work / "data"),
        "LORAFLEET_KAFKA_BOOTSTRAP": platform.kafka_bootstrap,
        "LORAFLEET_DATABASE_URL": database_url,
        "LORAFLEET_S3_ENDPOINT": platform.s3_endpoint,
        "LORAFLEET_S3_ACCESS_KEY": platform.s3_access_key,
        "LORAFLEET_S3_SECRET_KEY": platform.s3_secret_key,
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        # replicas (the ones the autoscaler starts inherit its environment)
        "LORAFLEET_REPLICA_MODEL_DIR": str(model_dir),
        "LORAFLEET_REPLICA_BASE_MODEL_HASH": base_model_hash(model_dir),
        "LORAFLEET_REPLICA_SERVICE_TOKEN": TOKEN,
        "LORAFLEET_REPLICA_ADAPTER_ROOT": str(work / "adapters"),
        "LORAFLEET_REPLICA_REGISTRY_URL": f"http://127.0.0.1:{ports + 4}",  # nothing listens: folders only
        "LORAFLEET_REPLICA_MAX_NUM_SEQS": str(cfg.max_num_seqs),
        "LORAFLEET_REPLICA_STATE_INTERVAL_S": "0.5",
        # the router, the placement worker and the stats stream count only this stack's replicas
        "LORAFLEET_GATEWAY_REPLICA_ID_PREFIX": prefix,
        "LORAFLEET_GATEWAY_REPLICA_SERVICE_TOKEN": TOKEN,
        "LORAFLEET_GATEWAY_REPLICA_STALE_S": "1.5",
        # a replica holding the adapter in a GPU slot goes first unless it is this many tokens busier: scaled
        # to requests of a few hundred tokens, as the queue threshold is
        "LORAFLEET_GATEWAY_GPU_PREFERENCE_TOKENS": "200",
        "LORAFLEET_GATEWAY_PUBLIC_PORT": str(ports),
        "LORAFLEET_GATEWAY_INTERNAL_PORT": str(ports + 1),
        "LORAFLEET_PLACEMENT_REPLICA_ID_PREFIX": prefix,
        "LORAFLEET_PLACEMENT_GROUP_ID": f"placement-{run}",
        "LORAFLEET_PLACEMENT_MEMBERSHIP_TTL_S": "5",
        "LORAFLEET_PLACEMENT_TICK_S": "0.3",
        "LORAFLEET_PLACEMENT_METRICS_PORT": "0",
        "LORAFLEET_RELAY_METRICS_PORT": "0",
        "LORAFLEET_RELAY_POLL_INTERVAL_S": "0.05",
        "LORAFLEET_STATS_REPLICA_ID_PREFIX": prefix,
        "LORAFLEET_STATS_APP_ID": f"lorafleet-stats-{run}",
        "LORAFLEET_STATS_FLEET": f"fleet-{run}",
        "LORAFLEET_STATS_DATA_DIR": str(work / "faust"),
        "LORAFLEET_STATS_WINDOW_S": str(cfg.window_s),
        "LORAFLEET_STATS_GRACE_S": "0.3",
        "LORAFLEET_STATS_IDLE_CLOSE_S": "3",
        "LORAFLEET_STATS_TICK_S": "0.3",
        "LORAFLEET_STATS_SESSION_TIMEOUT_S": "6",
        "LORAFLEET_STATS_METRICS_PORT": str(ports + 2),
        "LORAFLEET_STATS_QUEUE_PER_REPLICA": str(cfg.queue_per_replica),
        "LORAFLEET_STATS_MIN_REPLICAS": str(cfg.stats_min_replicas),
        "LORAFLEET_STATS_SCALE_DOWN_WINDOWS": str(cfg.scale_down_windows),
        "LORAFLEET_STATS_MAX_REPLICAS": str(cfg.max_replicas),
        "LORAFLEET_AUTOSCALE_FLEET": f"fleet-{run}",
        "LORAFLEET_AUTOSCALE_REPLICA_ID_PREFIX": prefix,
        "LORAFLEET_AUTOSCALE_FIRST_PORT": str(first_port),
        "LORAFLEET_AUTOSCALE_UNMANAGED_REPLICAS": str(cfg.unmanaged),
        "LORAFLEET_AUTOSCALE_MIN_REPLICAS": str(cfg.unmanaged),
        "LORAFLEET_AUTOSCALE_MAX_REPLICAS": str(cfg.max_replicas),
        "LORAFLEET_AUTOSCALE_COOLDOWN_S": str(cfg.cooldown_s),
        "LORAFLEET_AUTOSCALE_START_TIMEOUT_S": str(cfg.start_timeout_s),
        "LORAFLEET_AUTOSCALE_TICK_S": "0.3",
        "LORAFLEET_AUTOSCALE_REPLICA_SERVICE_TOKEN": TOKEN,
        "LORAFLEET_AUTOSCALE_MERGED_ENABLED": "false",  # no merged replicas in a scale-up run
        "LORAFLEET_AUTOSCALE_SIGNAL_MAX_AGE_S": str(max(10 * cfg.window_s, 20.0)),
        **cfg.env,
    }


@contextlib.asynccontextmanager
async def scaleup_stack(
    platform: PlatformSettings, work: Path, cfg: ScaleupConfig
) -> AsyncIterator[ScaleupStack]:
    """The stack, up and with replica 0 answering; the autoscaler is started (and restarted) by the caller."""
    run = cfg.run or new_run_id()
    name = f"scale_{run}"
    database_url = await create_database(platform.database_url, name)
    model_dir = ensure_default_model()
    base_hash = await asyncio.to_thread(base_model_hash, model_dir)
    await asyncio.to_thread(make_peft_adapters, model_dir, work / "adapters", list(cfg.adapters), base_hash)
    first_port = free_ports(cfg.max_replicas + 1 + 5)
    env = _env(platform, cfg, run, work, database_url, first_port)
    stack = ScaleupStack(
        run=run,
        cfg=cfg,
        work=work,
        env=env,
        platform=platform.model_copy(update={"data_dir": work / "data", "database_url": database_url}),
        first_port=first_port,
        gateway_url=f"http://127.0.0.1:{env['LORAFLEET_GATEWAY_PUBLIC_PORT']}",
    )
    try:
        stack.keys = await _seed(database_url, base_hash, cfg.adapters)
        sources = (topics.REPLICA_STATE, topics.REPLICA_EVENTS, topics.REQUESTS_COMPLETED)
        placement = (topics.ADAPTERS_VALIDATED, topics.ALIASES_CHANGED, topics.ADAPTER_STATS, *sources)
        await start_groups_at_end(
            platform,
            {
                env["LORAFLEET_STATS_APP_ID"]: sources,
                env["LORAFLEET_PLACEMENT_GROUP_ID"]: placement,
                **{
                    f"replica-{stack.replica_id(i)}": (topics.REPLICA_COMMANDS,)
                    for i in range(cfg.max_replicas)
                },
            },
        )
        replica0 = ["replica", "serve", "--replica-id", stack.replica_id(0), "--port", str(first_port)]
        # the placement worker and the relay place and load the adapters a replica warms before it is ready
        wanted = {
            "replica-0": replica0,
            "stats-stream": ["stats-stream"],
            "relay": ["relay"],
            "placement-worker": ["placement-worker"],
        }
        if cfg.gateway:
            wanted["gateway"] = ["public-gateway"]
        for proc_name, args in wanted.items():
            proc = Proc(proc_name, lorafleet(*args), env, work / f"{proc_name}.log")
            stack.procs[proc_name] = proc
            proc.start()

        async def replica0_ready() -> bool:
            state = await stack.state(0)
            return state is not None and state.status == "ready"

        await wait_for(replica0_ready, 120, "replica 0 ready", stack)
        if cfg.gateway:

            async def gateway_ready() -> bool:
                with contextlib.suppress(httpx.HTTPError):
                    async with httpx.AsyncClient() as c:
                        return (await c.get(f"{stack.gateway_url}/ready", timeout=2)).status_code == 200
                return False

            await wait_for(gateway_ready, 60, "the gateway ready", stack)
        yield stack
    finally:
        for proc in reversed(list(stack.procs.values())):
            if proc.name == "autoscaler":
                proc.stop()
        recs = stack.records()
        for r in recs.live():
            recs.process(r.index).stop(timeout=15)
        for proc in reversed(list(stack.procs.values())):
            proc.stop()
        await drop_database(platform.database_url, name)
