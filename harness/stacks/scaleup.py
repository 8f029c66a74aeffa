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
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx
from aiokafka import TopicPartition

from harness.adapters import make_peft_adapters
from harness.ports import free_ports
from harness.readiness import wait_for as _wait_for
from harness.running import Running
from harness.seed import Alias, ReadyAdapter, Seed, Tenant
from harness.spec import CheckReady, HttpReady, ProcessSpec, StackSpec, app_args, replica_args
from harness.stack import RunningStack, private_stack
from lorafleet.config import PlatformSettings
from lorafleet.kafka import make_consumer
from lorafleet.model.base_hash import base_model_hash
from lorafleet.model.prepare import ensure_default_model
from ops.autoscale.records import Records
from schemas import topics
from schemas.replica_api import StateResponse
from schemas.topics import Topic

TOKEN = "scaleup-replica-token"
TENANT = "acme"
ADAPTERS = {"acme-scale-a": "acme/scale-a:prod", "acme-scale-b": "acme/scale-b:prod"}
STOP_GRACE_S = 15.0


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


async def replica_state(url: str, replica_id: str) -> StateResponse | None:
    """The replica's answer on its state route, or None when it gives none."""
    try:
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}) as c:
            resp = await c.get(f"{url}/internal/replicas/{replica_id}/state", timeout=2.0)
        return StateResponse.model_validate_json(resp.content) if resp.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


@dataclass
class ScaleupStack:
    """The running stack, with the run's replica ids and ports (the autoscaler's replicas included)."""

    stack: RunningStack
    run: str
    cfg: ScaleupConfig
    first_port: int

    @property
    def work(self) -> Path:
        return self.stack.work

    @property
    def env(self) -> dict[str, str]:
        return self.stack.env

    @property
    def platform(self) -> PlatformSettings:
        """This stack's data folder and database."""
        return self.stack.platform

    @property
    def procs(self) -> dict[str, Running]:
        return self.stack.procs

    @property
    def keys(self) -> dict[str, str]:
        """tenant -> API key."""
        return self.stack.keys

    @property
    def gateway_url(self) -> str:
        return f"http://127.0.0.1:{self.env['LORAFLEET_GATEWAY_PUBLIC_PORT']}"

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

    def add(self, spec: ProcessSpec) -> Running:
        """A process of the stack, not started yet, stopped with the stack."""
        return self.stack.add(spec)

    def autoscaler(self, label: str = "") -> Running:
        """A fresh autoscaler process handle (the old one may have been killed), logging to its own file."""
        return self.add(replace(_app("autoscaler"), log=f"autoscaler-{label}" if label else ""))

    def start_replica(self, index: int) -> Running:
        """Start replica `index` here, not through the autoscaler (an unmanaged one beyond replica 0)."""
        return self.add(_replica(index, self.replica_id(index), self.first_port + index)).start()

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
        return await replica_state(self.replica_url(index), self.replica_id(index))

    def tails(self) -> str:
        logs = sorted(self.work.glob("*.log")) + sorted((self.work / "data" / "logs").glob("*.log"))
        return "\n".join(f"--- {p.name}\n{p.read_bytes().decode(errors='replace')[-2500:]}" for p in logs)

    def stop_autoscaling(self) -> None:
        """Stop every autoscaler, then the replicas they started."""
        for process in self.stack.started:
            if process.name == "autoscaler":
                process.stop()
        records = self.records()
        for r in records.live():
            records.process(r.index).stop(timeout=STOP_GRACE_S)


async def wait_for(check: Callable[[], object], timeout: float, what: str, stack: ScaleupStack) -> None:
    """Poll an (async) check until it is truthy; on timeout raise with every log's tail."""
    await _wait_for(check, timeout, what, stack.tails)


def new_run_id() -> str:
    """A fresh run id: the stack's database, fleet, groups and replica ids all carry it."""
    return uuid.uuid4().hex[:6]


def _replica(index: int, replica_id: str, port: int, ready: tuple[CheckReady, ...] = ()) -> ProcessSpec:
    """Replica `index` (named replica-<index>) as replica_id on port."""
    args = replica_args(replica_id, port)
    return ProcessSpec(f"replica-{index}", args, port, ready=ready, stop_grace_s=STOP_GRACE_S)


def _app(name: str, ready: tuple[HttpReady, ...] = (), command: str = "") -> ProcessSpec:
    return ProcessSpec(name, app_args(command or name), ready=ready, stop_grace_s=STOP_GRACE_S)


def scaleup_seed(base_hash: str, adapters: Mapping[str, str]) -> Seed:
    """Each alias's tenant (the part before its "/"), its adapter and the alias."""
    aliases = tuple(Alias.of(alias, adapter_id) for adapter_id, alias in adapters.items())
    tenants = tuple(Tenant(t, 1000, 10_000_000) for t in dict.fromkeys(a.tenant_id for a in aliases))
    return Seed(tenants, tuple(ReadyAdapter(a.adapter_id, a.tenant_id, base_hash) for a in aliases), aliases)


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
    cfg: ScaleupConfig, run: str, work: Path, model_dir: Path, base_hash: str, first_port: int
) -> dict[str, str]:
    ports = first_port + cfg.max_replicas + 1  # the block's ports after the replicas'
    return {
        # replicas (the ones the autoscaler starts inherit its environment)
        "LORAFLEET_REPLICA_MODEL_DIR": str(model_dir),
        "LORAFLEET_REPLICA_BASE_MODEL_HASH": base_hash,
        "LORAFLEET_REPLICA_ADAPTER_ROOT": str(work / "adapters"),
        "LORAFLEET_REPLICA_REGISTRY_URL": f"http://127.0.0.1:{ports + 4}",  # nothing listens: folders only
        "LORAFLEET_REPLICA_MAX_NUM_SEQS": str(cfg.max_num_seqs),
        # a replica holding the adapter in a GPU slot goes first unless it is this many tokens busier: scaled
        # to requests of a few hundred tokens, as the queue threshold is
        "LORAFLEET_GATEWAY_GPU_PREFERENCE_TOKENS": "200",
        "LORAFLEET_GATEWAY_PUBLIC_PORT": str(ports),
        "LORAFLEET_GATEWAY_INTERNAL_PORT": str(ports + 1),
        "LORAFLEET_PLACEMENT_GROUP_ID": f"placement-{run}",
        "LORAFLEET_PLACEMENT_MEMBERSHIP_TTL_S": "5",
        "LORAFLEET_PLACEMENT_TICK_S": "0.3",
        "LORAFLEET_PLACEMENT_METRICS_PORT": "0",
        "LORAFLEET_RELAY_METRICS_PORT": "0",
        "LORAFLEET_RELAY_POLL_INTERVAL_S": "0.05",
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
        "LORAFLEET_AUTOSCALE_REPLICA_ID_PREFIX": f"as{run}-",
        "LORAFLEET_AUTOSCALE_FIRST_PORT": str(first_port),
        "LORAFLEET_AUTOSCALE_UNMANAGED_REPLICAS": str(cfg.unmanaged),
        "LORAFLEET_AUTOSCALE_MIN_REPLICAS": str(cfg.unmanaged),
        "LORAFLEET_AUTOSCALE_MAX_REPLICAS": str(cfg.max_replicas),
        "LORAFLEET_AUTOSCALE_COOLDOWN_S": str(cfg.cooldown_s),
        "LORAFLEET_AUTOSCALE_START_TIMEOUT_S": str(cfg.start_timeout_s),
        "LORAFLEET_AUTOSCALE_TICK_S": "0.3",
        "LORAFLEET_AUTOSCALE_MERGED_ENABLED": "false",  # no merged replicas in a scale-up run
        "LORAFLEET_AUTOSCALE_SIGNAL_MAX_AGE_S": str(max(10 * cfg.window_s, 20.0)),
        **cfg.env,
    }


def scaleup_spec(
    cfg: ScaleupConfig, run: str, work: Path, model_dir: Path, base_hash: str, first_port: int
) -> StackSpec:
    """Replica 0 (ready once its state route says so), the stats stream, the relay, the placement worker and
    with cfg.gateway the public gateway (ready once it routes)."""
    env = _env(cfg, run, work, model_dir, base_hash, first_port)
    prefix = f"as{run}-"
    replica0_url = f"http://127.0.0.1:{first_port}"

    async def replica0_ready() -> bool:
        state = await replica_state(replica0_url, f"{prefix}0")
        return state is not None and state.status == "ready"

    # the placement worker and the relay place and load the adapters a replica warms before it is ready
    processes = [
        _replica(0, f"{prefix}0", first_port, (CheckReady("replica 0 ready", replica0_ready, 120),)),
        *(_app(name) for name in ("stats-stream", "relay", "placement-worker")),
    ]
    if cfg.gateway:  # named gateway here: the scale-up stack has no internal gateway
        ready = HttpReady(f"http://127.0.0.1:{env['LORAFLEET_GATEWAY_PUBLIC_PORT']}/ready", 60)
        processes.append(_app("gateway", (ready,), "public-gateway"))
    return StackSpec(
        processes=tuple(processes),
        database=f"scale_{run}",
        seed=scaleup_seed(base_hash, cfg.adapters),
        prefix=prefix,
        replica_token=TOKEN,
        fast_state=True,
        data_dir=work / "data",
        env=env,
    )


@contextlib.asynccontextmanager
async def scaleup_stack(
    platform: PlatformSettings, work: Path, cfg: ScaleupConfig
) -> AsyncIterator[ScaleupStack]:
    """The stack, up and with replica 0 answering; the autoscaler is started (and restarted) by the caller."""
    run = cfg.run or new_run_id()
    model_dir = ensure_default_model()
    base_hash = await asyncio.to_thread(base_model_hash, model_dir)
    await asyncio.to_thread(make_peft_adapters, model_dir, work / "adapters", list(cfg.adapters), base_hash)
    first_port = free_ports(cfg.max_replicas + 1 + 5)
    spec = scaleup_spec(cfg, run, work, model_dir, base_hash, first_port)
    sources = (topics.REPLICA_STATE, topics.REPLICA_EVENTS, topics.REQUESTS_COMPLETED)
    placement = (topics.ADAPTERS_VALIDATED, topics.ALIASES_CHANGED, topics.ADAPTER_STATS, *sources)
    await start_groups_at_end(
        platform,
        {
            spec.env["LORAFLEET_STATS_APP_ID"]: sources,
            spec.env["LORAFLEET_PLACEMENT_GROUP_ID"]: placement,
            **{f"replica-{spec.prefix}{i}": (topics.REPLICA_COMMANDS,) for i in range(cfg.max_replicas)},
        },
    )
    async with private_stack(spec, platform, work) as running:
        stack = ScaleupStack(running, run, cfg, first_port)
        try:
            yield stack
        finally:
            await asyncio.to_thread(stack.stop_autoscaling)
