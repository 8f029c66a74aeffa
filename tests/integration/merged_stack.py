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
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import httpx

from gateway.tenants import create_key, create_tenant
from harness.databases import create_database, drop_database
from harness.ports import free_port
from harness.processes import stop, wait_http
from harness.seed import ReadyAdapter, insert_alias, insert_ready_adapters
from lorafleet.client.upload import artifact_prefix, upload_peft_dir
from lorafleet.config import PlatformSettings, RelaySettings
from lorafleet.db.migrate import migrate
from lorafleet.kafka import make_producer
from lorafleet.retry import run_with_retry
from lorafleet.s3 import async_client
from ops.autoscale import merged_local
from ops.autoscale.config import AutoscaleSettings
from placement_worker.config import PlacementConfig, PlacementSettings
from placement_worker.main import run_worker
from relay.publisher import Relay
from tests.integration.gateway_stack import REPO, TOKEN, ReplicaProc, start_replica

TENANT = "acme"
ALIAS = "acme/heavy:prod"
WINDOW_S = 3.0
MERGE_TOKENS_PER_S = 3.0  # CPU replicas on a shared machine: a few tokens/s is "a full replica" here
DEMOTE_TOKENS_PER_S = 2.0  # the demotion's trickle of 2-token requests every 2 s stays under it


@dataclass
class MergedStack:
    url: str
    internal_url: str
    pool: asyncpg.Pool
    key: str
    versions: tuple[str, str]
    prefix: str
    actuator: AutoscaleSettings
    platform: PlatformSettings  # the actuator's (its run folder holds the merged replicas' pid files)

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


async def _seed(
    platform: PlatformSettings, dirs: dict[str, Path], base_hash: str
) -> tuple[asyncpg.Pool, str]:
    await migrate(platform.database_url)
    pool = await asyncpg.create_pool(platform.database_url, min_size=1, max_size=6)
    await create_tenant(pool, TENANT, 100, 10_000_000)
    key = (await create_key(pool, TENANT)).secret
    async with async_client(platform) as s3:
        for version, (adapter_id, folder) in enumerate(dirs.items(), start=1):
            prefix = artifact_prefix(TENANT, adapter_id)
            checksum = await upload_peft_dir(s3, folder, platform.s3_bucket, prefix)
            uri = f"s3://{platform.s3_bucket}/{prefix}"
            await insert_ready_adapters(
                pool, [ReadyAdapter(adapter_id, TENANT, base_hash, version, checksum, weights_uri=uri)]
            )
    await insert_alias(pool, ALIAS, TENANT, next(iter(dirs)))
    return pool, key


async def _wait_registry(url: str, adapter_id: str, proc: subprocess.Popen, timeout: float = 60) -> None:
    """Until the internal gateway answers for the adapter (the merged replica's registry)."""
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}) as c:
        while time.monotonic() < deadline:
            assert proc.poll() is None, "the internal gateway exited"
            with contextlib.suppress(httpx.HTTPError):
                if (await c.get(f"{url}/internal/adapters/{adapter_id}", timeout=2)).status_code == 200:
                    return
            await asyncio.sleep(0.3)
    raise TimeoutError(f"{url} did not answer for {adapter_id} within {timeout}s")


def _process(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "lorafleet.cli", *args],
            env=env,
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


@contextlib.asynccontextmanager
async def merged_stack(
    platform: PlatformSettings, adapter_root: Path, versions: tuple[str, str], base_hash: str, work: Path
) -> AsyncIterator[MergedStack]:
    name = f"mg_{uuid.uuid4().hex[:10]}"
    admin_url = platform.database_url
    database_url = await create_database(admin_url, name)
    platform = platform.model_copy(update={"database_url": database_url})
    pool, key = await _seed(platform, {v: adapter_root / v for v in versions}, base_hash)
    prefix = f"mg{uuid.uuid4().hex[:6]}-"
    public_port, internal_port = free_port(), free_port()
    internal_url = f"http://127.0.0.1:{internal_port}"
    common = {
        "LORAFLEET_KAFKA_BOOTSTRAP": platform.kafka_bootstrap,
        "LORAFLEET_DATABASE_URL": database_url,
        "LORAFLEET_S3_ENDPOINT": platform.s3_endpoint,
        "LORAFLEET_S3_ACCESS_KEY": platform.s3_access_key,
        "LORAFLEET_S3_SECRET_KEY": platform.s3_secret_key,
        "LORAFLEET_REPLICA_SERVICE_TOKEN": TOKEN,
        "LORAFLEET_REPLICA_REGISTRY_URL": internal_url,
        "LORAFLEET_REPLICA_REGISTRY_TOKEN": TOKEN,
        "LORAFLEET_REPLICA_MAX_NUM_SEQS": "8",
        "LORAFLEET_REPLICA_BASE_MODEL_HASH": base_hash,
        "LORAFLEET_REPLICA_STATE_INTERVAL_S": "0.5",
        "LORAFLEET_REPLICA_DRAIN_DEADLINE_S": "60",
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
    }
    env = {
        **os.environ,
        **common,
        "LORAFLEET_REPLICA_ADAPTER_ROOT": str(adapter_root),  # the unmerged replicas only
        "LORAFLEET_GATEWAY_SERVICE_TOKEN": TOKEN,
        "LORAFLEET_GATEWAY_REPLICA_SERVICE_TOKEN": TOKEN,
        "LORAFLEET_GATEWAY_REPLICA_STALE_S": "1.5",
        "LORAFLEET_GATEWAY_KEY_CACHE_TTL_S": "0.5",
        "LORAFLEET_GATEWAY_REPLICA_ID_PREFIX": prefix,
        "LORAFLEET_GATEWAY_PUBLIC_PORT": str(public_port),
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
        "LORAFLEET_STATS_REPLICA_ID_PREFIX": prefix,
    }
    procs = [
        _process(["gateway"], env, work / "gateway.log"),
        _process(["public-gateway"], env, work / "public-gateway.log"),
        _process(["stats-stream"], env, work / "stats-stream.log"),
    ]
    replicas = [ReplicaProc(f"{prefix}{i}", free_port(), work / f"{prefix}{i}.log") for i in range(2)]
    for r in replicas:
        start_replica(r, env)
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
    actuator = AutoscaleSettings(
        replica_id_prefix=prefix,
        merged_first_port=free_port(),
        merged_max_replicas=2,
        tick_s=0.3,
        start_timeout_s=240,
        drain_deadline_s=60,
        replica_service_token=TOKEN,  # type: ignore[arg-type]  # pydantic turns it into a SecretStr
    )
    actuator_platform = platform.model_copy(update={"data_dir": work / "actuator"})
    stop_event, worker_ready = asyncio.Event(), asyncio.Event()
    producer = make_producer(platform)
    await producer.start()
    tasks = [
        asyncio.create_task(
            Relay(pool, producer, RelaySettings(poll_interval_s=0.05, metrics_port=0)).run(stop_event)
        ),
        asyncio.create_task(  # as `lorafleet placement-worker` runs it: restarted after a failure
            run_with_retry(
                "placement-worker",
                lambda stop: run_worker(
                    PlacementConfig(platform, placement), stop, ready=worker_ready, from_end=True
                ),
                stop_event,
                platform,
            )
        ),
    ]
    stack = MergedStack(
        f"http://127.0.0.1:{public_port}",
        internal_url,
        pool,
        key,
        versions,
        prefix,
        actuator,
        actuator_platform,
    )
    try:
        with _environ(common):
            tasks.append(asyncio.create_task(merged_local.run(actuator_platform, actuator)))
            await asyncio.wait_for(worker_ready.wait(), 60)
            for r in replicas:
                await wait_http(f"{r.url}/health", 180, r.proc)
            await _wait_registry(internal_url, versions[0], procs[0])
            await wait_http(f"{stack.url}/ready", 60, procs[1])
            yield stack
    finally:
        stop_event.set()
        tasks[-1].cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        records = merged_local.merged_records(actuator_platform, actuator)
        for record in records.live():
            records.process(record.index).stop(timeout=10)
        for p in procs:
            stop(p)
        for r in replicas:
            stop(r.proc)
        await producer.stop()
        await pool.close()
        await drop_database(admin_url, name)
