"""The fleet benchmark's stack: its own database (the tenants and their keys), Redis, the internal API and
the registry validator (which the adapters are registered through, bench/fleet_register.py), the relay,
the placement worker, the stats stream, two public gateways sharing that Redis, and the calibrated stand-in
host with K replicas; a second host process with one replica joins (and is killed) on demand.

Replica ids carry the run's prefix (`fl<run>-<index>`), which the gateways, the placement worker and the
stats stream alone count, so other stacks on the same Kafka and PostgreSQL are invisible to it.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from bench.fleet_register import FleetAdapter
from bench.gateway_stack import REPO
from harness.ports import free_port, free_ports
from harness.redis_server import redis_server
from harness.running import Running
from harness.seed import Seed, Tenant
from harness.spec import HttpReady, ProcessSpec, StackSpec, app_args
from harness.stack import RunningStack, private_stack
from harness.stacks.scaleup import start_groups_at_end
from lorafleet.config import PlatformSettings
from schemas import principals, topics

TOKEN = "fleet-bench-replica-token"
SERVICE_TOKEN = "fleet-bench-service-token"
STOP_GRACE_S = 15.0


@dataclass(frozen=True)
class FleetConfig:
    adapters: int = 5000
    tenants: int = 50
    replicas: int = 26
    routing: str = "cost"
    slow: float = 1.0  # the stand-ins' wall seconds per model second
    state_interval_s: float = 1.0
    gpu_slots: int = 250
    calibration: tuple[Path, ...] = ()
    run: str = ""
    # the served model's tokenizer.json: the replay cuts real text to each request's prompt length under it,
    # and the stand-ins count prompts with it, so they prefill the trace's lengths; None: words and bytes
    tokenizer: Path | None = None


def adapter_name(rank: int) -> str:
    return f"adapter-{rank:05d}"


def tenant_name(rank: int, tenants: int) -> str:
    return f"tenant-{rank % tenants:03d}"


def alias_name(rank: int, tenants: int) -> str:
    """The alias of the adapter of popularity rank `rank`; its tenant is the part before the "/"."""
    return f"{tenant_name(rank, tenants)}/a{rank:05d}:prod"


def fleet_seed(cfg: FleetConfig) -> Seed:
    """The tenants with their keys; the adapters and aliases go in through the internal API."""
    return Seed(
        tuple(Tenant(tenant_name(t, cfg.tenants), 100_000.0, 2_000_000_000) for t in range(cfg.tenants))
    )


def fleet_adapters(cfg: FleetConfig) -> list[FleetAdapter]:
    """Adapter i of popularity rank i, its tenant and its alias."""
    return [
        FleetAdapter(adapter_name(r), tenant_name(r, cfg.tenants), alias_name(r, cfg.tenants))
        for r in range(cfg.adapters)
    ]


def host_spec(name: str, ids: list[str], first_port: int, cfg: FleetConfig, work: Path) -> ProcessSpec:
    """A stand-in host process serving ids on first_port onwards."""
    args = ["bench", "standin-host", "--first-port", str(first_port), "--slow", str(cfg.slow)]
    args += ["--gpu-slots", str(cfg.gpu_slots), "--state-interval-s", str(cfg.state_interval_s)]
    args += ["--report", str(work / f"{name}.json")]
    args += [a for path in cfg.calibration for a in ("--calibration", str(path))]
    args += ["--tokenizer", str(cfg.tokenizer)] if cfg.tokenizer is not None else []
    args += [a for rid in ids for a in ("--replica-id", rid)]
    ready = tuple(HttpReady(f"http://127.0.0.1:{first_port + i}/health", 90) for i in range(len(ids)))
    return ProcessSpec(name, tuple(args), first_port, ready=ready, stop_grace_s=STOP_GRACE_S)


def _app(
    name: str, command: str, env: dict[str, str] | None = None, port: int | None = None, path: str = "/ready"
) -> ProcessSpec:
    auth = {"Authorization": f"Bearer {SERVICE_TOKEN}"}
    ready = (HttpReady(f"http://127.0.0.1:{port}{path}", 90, auth),) if port is not None else ()
    return ProcessSpec(name, app_args(command), port, env or {}, ready, stop_grace_s=STOP_GRACE_S)


@dataclass
class FleetStack:
    stack: RunningStack
    cfg: FleetConfig
    run: str
    gateways: list[str]
    standin_urls: list[str]
    joiner_url: str
    joiner: ProcessSpec
    internal_url: str
    stats_url: str

    @property
    def prefix(self) -> str:
        return f"fl{self.run}-"

    def replica_id(self, index: int) -> str:
        return f"{self.prefix}{index}"

    def start_joiner(self) -> Running:
        return self.stack.add(self.joiner).start()


def _env(cfg: FleetConfig, run: str, work: Path, redis_url: str, ports: dict[str, int]) -> dict[str, str]:
    return {
        "PYTHONPATH": str(REPO),
        "LORAFLEET_GATEWAY_SERVICE_TOKEN": SERVICE_TOKEN,
        "LORAFLEET_GATEWAY_VALIDATOR_GROUP": validator_group(run),
        "LORAFLEET_GATEWAY_VALIDATOR_METRICS_PORT": "0",
        "LORAFLEET_REDIS_URL": redis_url,
        "LORAFLEET_GATEWAY_ROUTING_MODE": cfg.routing,
        # the gateway's waits for a first token and between tokens are wall time: the stand-ins' slowed clock
        # stretches them too
        "LORAFLEET_GATEWAY_FIRST_TOKEN_TIMEOUT_S": str(10.0 * cfg.slow),
        "LORAFLEET_GATEWAY_STALL_TIMEOUT_S": str(10.0 * cfg.slow),
        # On loopback a connection to a port nothing listens on is refused at once (a killed stand-in is still
        # found at once); a connect that times out means only that the gateway's loop did not get the CPU in
        # time, with every process on two cores. The 2 s default took replicas out of routing for it.
        "LORAFLEET_GATEWAY_REPLICA_CONNECT_TIMEOUT_S": "10.0",
        "LORAFLEET_PLACEMENT_GROUP_ID": f"placement-{run}",
        "LORAFLEET_PLACEMENT_METRICS_PORT": "0",
        "LORAFLEET_RELAY_METRICS_PORT": "0",
        "LORAFLEET_STATS_APP_ID": f"lorafleet-stats-{run}",
        "LORAFLEET_STATS_FLEET": f"fleet-{run}",
        "LORAFLEET_STATS_DATA_DIR": str(work / "faust"),
        "LORAFLEET_STATS_METRICS_PORT": str(ports["stats"]),
        "LORAFLEET_GATEWAY_INTERNAL_PORT": str(ports["internal"]),
    }


def validator_group(run: str) -> str:
    """The run's own registry validator group, under the prefix the validator's login may read."""
    return f"{principals.VALIDATOR_GROUP_PREFIX}-{run}"


def groups(run: str, replica_ids: list[str]) -> dict[str, tuple[topics.Topic, ...]]:
    """The run's consumer groups and the topics each reads."""
    sources = (topics.REPLICA_STATE, topics.REPLICA_EVENTS, topics.REQUESTS_COMPLETED)
    placement = (topics.ADAPTERS_VALIDATED, topics.ALIASES_CHANGED, topics.ADAPTER_STATS, *sources)
    return {
        validator_group(run): (topics.ADAPTERS_REGISTERED,),
        f"lorafleet-stats-{run}": sources,
        f"placement-{run}": placement,
        **{f"replica-{rid}": (topics.REPLICA_COMMANDS,) for rid in replica_ids},
    }


@contextlib.asynccontextmanager
async def fleet_stack(platform: PlatformSettings, work: Path, cfg: FleetConfig) -> AsyncIterator[FleetStack]:
    """The stack up: every stand-in answering and both gateways ready."""
    run = cfg.run or uuid.uuid4().hex[:6]
    prefix = f"fl{run}-"
    ids = [f"{prefix}{i}" for i in range(cfg.replicas + 1)]  # the last one joins later
    first = free_ports(cfg.replicas + 1)
    await start_groups_at_end(platform, groups(run, ids))
    with redis_server(work) as redis:
        own = {"internal": free_port(), "stats": free_port()}
        env = _env(cfg, run, work, redis.url, own)
        ports = [free_port(), free_port()]
        gateways = [
            _app(f"gateway-{i}", "public-gateway", {"LORAFLEET_GATEWAY_PUBLIC_PORT": str(p)}, p)
            for i, p in enumerate(ports)
        ]
        processes = (
            host_spec("standin-host", ids[:-1], first, cfg, work),
            _app("gateway", "gateway", port=own["internal"], path="/openapi.json"),
            *(
                _app(name, name)
                for name in ("registry-validator", "stats-stream", "relay", "placement-worker")
            ),
            *gateways,
        )
        spec = StackSpec(
            processes=processes,
            database=f"fleet_{run}",
            seed=fleet_seed(cfg),
            prefix=prefix,
            replica_token=TOKEN,
            data_dir=work / "data",
            env=env,
        )
        async with private_stack(spec, platform, work) as running:
            yield FleetStack(
                running,
                cfg,
                run,
                [g.url for g in gateways],
                [f"http://127.0.0.1:{first + i}" for i in range(cfg.replicas)],
                f"http://127.0.0.1:{first + cfg.replicas}",
                host_spec("standin-joiner", ids[-1:], first + cfg.replicas, cfg, work),
                f"http://127.0.0.1:{own['internal']}",
                f"http://127.0.0.1:{own['stats']}",
            )
