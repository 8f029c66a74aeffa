"""A real stack for the merged-replica tests, with nothing published by hand.

A fresh database with one tenant, a key and two adapter versions uploaded to the real object store (their
real checksums registered, status ready) behind one alias; the internal gateway (the registry the merged
replica fetches from) and the public gateway as processes; two unmerged SmolLM2 replica processes (their
adapters from local folders, the single-machine default); the stats stream as a process with short windows;
and in this process the outbox relay, the placement worker and the merged-replica actuator (from the topics'
ends where a shared Kafka holds earlier runs). The actuator starts its merged replicas as processes, with the
environment of this process: only the registry, never a folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from harness.env import QUIET_ENV, platform_env
from harness.ports import free_port
from harness.seed import Alias, ReadyAdapter, Seed, Tenant
from harness.spec import HttpReady, ProcessSpec, StackSpec, app_args, replica_args
from harness.stack import RunningStack, private_stack
from harness.stacks.gateway import TOKEN, public_gateway
from harness.workers import outbox_relay, placement_worker
from lorafleet.client.upload import artifact_prefix, upload_peft_dir
from lorafleet.config import PlatformSettings
from lorafleet.s3 import async_client
from ops.autoscale import merged_local
from ops.autoscale.config import AutoscaleSettings
from placement_worker.config import PlacementSettings

TENANT = "acme"
ALIAS = "acme/heavy:prod"
WINDOW_S = 3.0
MERGE_TOKENS_PER_S = 3.0  # CPU replicas on a shared machine: a few tokens/s is "a full replica" here
DEMOTE_TOKENS_PER_S = 2.0  # the demotion's trickle of 2-token requests every 2 s stays under it
ADAPTER_ROOT = "LORAFLEET_REPLICA_ADAPTER_ROOT"  # the unmerged replicas' folders; merged ones have none


@dataclass
class MergedStack:
    stack: RunningStack
    versions: tuple[str, str]
    actuator: AutoscaleSettings
    platform: PlatformSettings  # the actuator's (its run folder holds the merged replicas' pid files)

    @property
    def url(self) -> str:
        return self.stack.procs["public-gateway"].url

    @property
    def internal_url(self) -> str:
        return self.stack.procs["gateway"].url

    @property
    def pool(self) -> asyncpg.Pool:
        assert self.stack.pool is not None
        return self.stack.pool

    @property
    def key(self) -> str:
        return self.stack.keys[TENANT]

    @property
    def prefix(self) -> str:
        return self.stack.spec.prefix

    async def targets(self) -> list[tuple[str, int, str]]:
        """(adapter, desired, reason) of every merged.target the placement worker wrote, in order."""
        rows = await self.pool.fetch(
            """SELECT payload->>'adapter_id' AS a, (payload->>'desired_replicas')::int AS d,
                      payload->>'reason' AS r
               FROM outbox WHERE aggregate_type = 'merged.targets' ORDER BY seq"""
        )
        return [(r["a"], r["d"], r["r"]) for r in rows]

    def merged_pids(self) -> dict[str, int]:
        """adapter -> pid of each live merged replica the actuator started."""
        records = merged_local.merged_records(self.platform, self.actuator)
        out = {}
        for r in records.live():
            adapter = records.process(r.index).pid_file.with_suffix(".adapter").read_text().strip()
            out[adapter] = r.pid
        return out


@contextlib.contextmanager
def _environ(changes: dict[str, str]) -> Iterator[None]:
    """os.environ with changes (the actuator's merged replicas inherit it), restored afterwards."""
    saved = {k: os.environ.get(k) for k in changes}
    os.environ.update(changes)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


async def _upload(platform: PlatformSettings, dirs: dict[str, Path], base_hash: str) -> list[ReadyAdapter]:
    """Each folder uploaded as the next version of the tenant's adapter, with its real checksum."""
    adapters = []
    async with async_client(platform) as s3:
        for version, (adapter_id, folder) in enumerate(dirs.items(), start=1):
            prefix = artifact_prefix(TENANT, adapter_id)
            checksum = await upload_peft_dir(s3, folder, platform.s3_bucket, prefix)
            uri = f"s3://{platform.s3_bucket}/{prefix}"
            adapters.append(ReadyAdapter(adapter_id, TENANT, base_hash, version, checksum, weights_uri=uri))
    return adapters


def merged_spec(adapters: list[ReadyAdapter], adapter_root: Path, base_hash: str, work: Path) -> StackSpec:
    """Two unmerged replicas, the internal and public gateways, the stats stream with short windows; the
    relay and the placement worker (with low promotion thresholds) in this process."""
    prefix = f"mg{uuid.uuid4().hex[:6]}-"
    internal_port = free_port()
    internal_url = f"http://127.0.0.1:{internal_port}"
    replicas = []
    for i in range(2):
        rid, port = f"{prefix}{i}", free_port()
        health = HttpReady(f"http://127.0.0.1:{port}/health", 180)
        replicas.append(ProcessSpec(rid, replica_args(rid, port), port, ready=(health,)))
    registry = HttpReady(  # the merged replica's registry answers for the adapter
        f"{internal_url}/internal/adapters/{adapters[0].adapter_id}", 60, {"Authorization": f"Bearer {TOKEN}"}
    )
    internal = ProcessSpec("gateway", app_args("gateway"), internal_port, ready=(registry,))
    placement = PlacementSettings(
        group_id=f"placement-{prefix}",
        replica_id_prefix=prefix,
        membership_ttl_s=5.0,
        tick_s=0.2,
        metrics_port=0,
        merge_tokens_per_s=MERGE_TOKENS_PER_S,
        demote_tokens_per_s=DEMOTE_TOKENS_PER_S,
        merge_windows=2,
        # a merged replica's start slows the CPU replicas' answers below the demote threshold for a few
        # windows; four keep the promotion through it
        demote_windows=4,
        merge_check_s=0.5,
    )
    return StackSpec(
        processes=(
            *replicas,
            internal,
            public_gateway(ready=(("/ready", 60),)),
            ProcessSpec("stats-stream", app_args("stats-stream")),
        ),
        database=f"mg_{uuid.uuid4().hex[:10]}",
        seed=Seed(
            (Tenant(TENANT, 100, 10_000_000),),
            tuple(adapters),
            (Alias(ALIAS, TENANT, adapters[0].adapter_id),),
        ),
        prefix=prefix,
        replica_token=TOKEN,
        fast_state=True,
        env={
            "LORAFLEET_REPLICA_REGISTRY_URL": internal_url,
            "LORAFLEET_REPLICA_REGISTRY_TOKEN": TOKEN,
            "LORAFLEET_REPLICA_MAX_NUM_SEQS": "8",
            "LORAFLEET_REPLICA_BASE_MODEL_HASH": base_hash,
            "LORAFLEET_REPLICA_DRAIN_DEADLINE_S": "60",
            ADAPTER_ROOT: str(adapter_root),
            "LORAFLEET_GATEWAY_SERVICE_TOKEN": TOKEN,
            "LORAFLEET_GATEWAY_KEY_CACHE_TTL_S": "0.5",
            "LORAFLEET_GATEWAY_INTERNAL_PORT": str(internal_port),
            "LORAFLEET_STATS_APP_ID": f"lorafleet-stats-{prefix}",
            "LORAFLEET_STATS_FLEET": prefix,
            "LORAFLEET_STATS_DATA_DIR": str(work / "faust"),
            "LORAFLEET_STATS_WINDOW_S": str(WINDOW_S),
            "LORAFLEET_STATS_GRACE_S": "0.5",
            "LORAFLEET_STATS_IDLE_CLOSE_S": "2",
            "LORAFLEET_STATS_TICK_S": "0.3",
            "LORAFLEET_STATS_SESSION_TIMEOUT_S": "6",
            "LORAFLEET_STATS_METRICS_PORT": "0",
        },
        pool_size=6,
        workers=(outbox_relay, lambda platform, _pool: placement_worker(platform, placement)),
    )


def merged_replica_env(stack: RunningStack) -> dict[str, str]:
    """What a merged replica needs: the platform, the replica settings less the adapter folders."""
    replica = {k: v for k, v in stack.env.items() if k.startswith("LORAFLEET_REPLICA_") and k != ADAPTER_ROOT}
    return {**platform_env(stack.platform), **replica, **QUIET_ENV}


@contextlib.asynccontextmanager
async def actuator_running(
    stack: RunningStack, settings: AutoscaleSettings, platform: PlatformSettings
) -> AsyncIterator[None]:
    """The merged-replica actuator in this process; its merged replicas stopped afterwards."""
    with _environ(merged_replica_env(stack)):
        task = asyncio.create_task(merged_local.run(platform, settings))
        try:
            yield
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            records = merged_local.merged_records(platform, settings)
            for record in records.live():
                records.process(record.index).stop(timeout=10)


@contextlib.asynccontextmanager
async def merged_stack(
    platform: PlatformSettings, adapter_root: Path, versions: tuple[str, str], base_hash: str, work: Path
) -> AsyncIterator[MergedStack]:
    adapters = await _upload(platform, {v: adapter_root / v for v in versions}, base_hash)
    spec = merged_spec(adapters, adapter_root, base_hash, work)
    actuator = AutoscaleSettings(
        replica_id_prefix=spec.prefix,
        merged_first_port=free_port(),
        merged_max_replicas=2,
        tick_s=0.3,
        start_timeout_s=240,
        drain_deadline_s=60,
        replica_service_token=TOKEN,  # type: ignore[arg-type]  # pydantic turns it into a SecretStr
    )
    async with private_stack(spec, platform, work) as stack:
        actuator_platform = stack.platform.model_copy(update={"data_dir": work / "actuator"})
        async with actuator_running(stack, actuator, actuator_platform):
            yield MergedStack(stack, versions, actuator, actuator_platform)
