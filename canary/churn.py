"""Isolation under churn on a replica's production path, judged by canary markers.

A started Replica (the runtime, its AdapterCache and GpuTier, as `lorafleet replica serve` builds them)
serves more canaries than it has GPU slots, with host RAM too small to hold them all: requests keep
evicting idle slots and RAM entries, and a RAM miss reads the adapter back from the disk tier and writes
its slot on a worker thread while the engine thread decodes other rows. Every request goes through the
replica's HTTP app in this process (the generate route a gateway calls: the cache's acquire, the NDJSON
stream, the release when the response ends), `concurrency` at a time.

Pass means: no output carries another adapter's marker; every adapter request carries its own (the base
emits no marker, so an adapter request answered by the base, or by no adapter, has none); no request
fails; and at the end no slot, RAM or disk entry is pinned and no request or engine row is left.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from canary.check import IsolationTally
from canary.manifest import CanaryManifest
from canary.markers import Marker, markers_in_tokens
from canary.prompts import PromptSampler
from canary.tiny_base import TINY_CONFIG
from replica.adapter_cache.gpu import Loaded
from replica.adapter_cache.host import HostAdapter
from replica.config import ReplicaSettings
from replica.runtime import Replica
from replica.server import create_app
from schemas.replica_api import GenerateRequest

SERVICE_TOKEN = "churn-service-token"
MAX_MODEL_LEN = 64  # the tiny base's prompts are at most 18 tokens
# KV blocks of 8 tokens (a shared prefix fills one within the prompt lengths canaries know), 1,024 of
# them for the tiny base: a few running rows' worth, so cached blocks are evicted under churn
KV_BLOCK_SIZE = 8
KV_CACHE_BYTES = 4 << 20
PINS_DEADLINE_S = 30.0  # rows release their pins on the engine thread just after their last token


@dataclass(frozen=True)
class ChurnConfig:
    """One run's shape: the request count and how tight the GPU slots and host RAM are."""

    requests: int
    concurrency: int = 64
    slots_per_bucket: int = 2  # GPU slots in each rank bucket
    ram_adapters: int = 6  # host RAM holds about this many of the largest canaries
    max_new_tokens: int = 3
    base_fraction: float = 0.2
    max_num_seqs: int = 32
    seed: int = 0


@dataclass(frozen=True)
class ChurnRequest:
    request_id: str
    adapter_id: str | None  # None: base only
    prompt_token_ids: list[int]


@dataclass
class SlotWrites:
    """GpuTier.load calls seen during the run: on a worker thread, and while the engine had running rows."""

    total: int = 0
    off_loop: int = 0
    during_decode: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def counts(self) -> dict[str, int]:
        return {"total": self.total, "off_loop": self.off_loop, "during_decode": self.during_decode}


def churn_settings(
    base: Path, adapters: Path, manifest: CanaryManifest, cfg: ChurnConfig, cache_dir: Path
) -> ReplicaSettings:
    """A replica over the tiny base serving every canary from its folder, with few slots and little RAM."""
    dirs = {e.adapter_id: adapters / e.path for e in manifest.adapters}
    largest = max((d / "adapter_model.safetensors").stat().st_size for d in dirs.values())
    ranks = sorted({e.rank for e in manifest.adapters})
    return ReplicaSettings(
        model_dir=base,
        device="cpu",
        service_token=SERVICE_TOKEN,
        base_model_hash=manifest.base_model_hash,
        max_num_seqs=cfg.max_num_seqs,
        max_model_len=MAX_MODEL_LEN,
        lora_slots={rank: cfg.slots_per_bucket for rank in ranks},
        max_lora_rank=max(ranks),
        lora_target_modules=manifest.target_modules,
        adapter_dirs=dirs,
        registry_url=None,
        control_enabled=False,
        cache_dir=cache_dir,
        ram_budget_bytes=cfg.ram_adapters * largest,
        kv_cache_bytes=KV_CACHE_BYTES,
        kv_block_size=KV_BLOCK_SIZE,
    )


def churn_requests(cfg: ChurnConfig, adapter_ids: list[str]) -> Iterator[ChurnRequest]:
    """cfg.requests requests in random order: base-only with probability base_fraction, else any canary."""
    sampler = PromptSampler(int(TINY_CONFIG["vocab_size"]), None, int(TINY_CONFIG["bos_token_id"]))
    rng = random.Random(f"churn-requests:{cfg.seed}")
    for i in range(cfg.requests):
        adapter = None if rng.random() < cfg.base_fraction else rng.choice(adapter_ids)
        yield ChurnRequest(f"churn-{i}", adapter, sampler.sample(rng))


def watch_slot_writes(replica: Replica) -> SlotWrites:
    """Count the replica's slot writes (GpuTier.load) by thread and by whether rows were decoding."""
    gpu = replica.gpu
    assert gpu is not None, "a multi-adapter replica has a GPU tier"
    loop_thread = threading.get_ident()
    running = replica.engine.engine.scheduler.running
    writes = SlotWrites()
    real = gpu.load

    def load(host: HostAdapter, hold: bool = False) -> Loaded:
        decoding = len(running) > 0
        result = real(host, hold)
        with writes.lock:
            writes.total += 1
            writes.off_loop += threading.get_ident() != loop_thread
            writes.during_decode += decoding
        return result

    gpu.load = load  # type: ignore[method-assign]
    return writes


async def settled_pins(replica: Replica, deadline_s: float = PINS_DEADLINE_S) -> dict[str, int]:
    """The replica's open holds (Replica.holds) once they are all zero, or as they are at the deadline."""
    deadline = time.monotonic() + deadline_s
    while True:
        pins = replica.holds()
        if not any(pins.values()) or time.monotonic() > deadline:
            return pins
        await asyncio.sleep(0.05)


def _metric(replica: Replica, name: str, labels: dict[str, str]) -> int:
    value = replica.metrics.registry.get_sample_value(name, labels)
    return int(value or 0)


async def _serve_one(client: httpx.AsyncClient, url: str, req: ChurnRequest, max_tokens: int) -> list[int]:
    """One generate request; its token ids, or RuntimeError with the status or error line."""
    body = GenerateRequest(
        prompt_token_ids=req.prompt_token_ids,
        adapter_id=req.adapter_id,
        request_id=req.request_id,
        temperature=0.0,
        max_tokens=max_tokens,
        ignore_eos=True,
    )
    tokens: list[int] = []
    async with client.stream("POST", url, json=body.model_dump(exclude_none=True)) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"HTTP {resp.status_code}: {(await resp.aread()).decode()[:200]}")
        async for line in resp.aiter_lines():
            if not line:
                continue
            event = json.loads(line)
            if event["type"] == "token":
                tokens.append(int(event["token_id"]))
            elif event["type"] == "error":
                raise RuntimeError(f"{event['error'].get('code')}: {event['error'].get('message')}")
    return tokens


async def run_churn(replica: Replica, cfg: ChurnConfig, markers: list[Marker]) -> dict[str, object]:
    """Serve cfg.requests canary requests through the replica's app and return the JSON-ready verdict.

    The replica must not be started: the app's lifespan starts it and stops it at the end.
    """
    app = create_app(replica)
    writes = watch_slot_writes(replica)
    tally = IsolationTally()
    url = f"/internal/replicas/{replica.settings.replica_id}/generate"
    pending = churn_requests(cfg, [m.adapter_id for m in markers])
    running = replica.engine.engine.scheduler.running
    max_batch = 0
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)  # a failure is a 500, as served
    headers = {"Authorization": f"Bearer {replica.settings.service_token}"}
    client = httpx.AsyncClient(transport=transport, base_url="http://replica", headers=headers, timeout=300)
    async with app.router.lifespan_context(app), client:

        async def worker() -> None:
            nonlocal max_batch
            for req in pending:  # the workers share one iterator: each request is sent once
                try:
                    tokens = await _serve_one(client, url, req, cfg.max_new_tokens)
                except (RuntimeError, httpx.HTTPError) as exc:
                    tally.record_error(req.request_id, req.adapter_id, str(exc))
                    continue
                max_batch = max(max_batch, len(running))
                tally.record(req.request_id, req.adapter_id, markers_in_tokens(tokens, markers))

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(cfg.concurrency)))
        wall_s = time.perf_counter() - start
        cache = replica.cache
        assert cache is not None
        await cache.settle()
        pins = await settled_pins(replica)
        loads = "lorafleet_replica_adapter_loads_total"
        evictions = "lorafleet_replica_adapter_evictions_total"
        counts = {
            "slot_loads": cache.gpu_loads.total,
            "gpu_evictions": cache.gpu_evictions.total,
            "ram_evictions": _metric(replica, evictions, {"tier": "ram"}),
            "disk_reads": _metric(replica, loads, {"from_tier": "disk", "to_tier": "ram"}),
        }
    return tally.summary() | {
        "wall_s": round(wall_s, 2),
        "requests_per_s": round(cfg.requests / wall_s, 1) if wall_s > 0 else None,
        "adapters": len(markers),
        "gpu_slots": sum(replica.settings.lora_slots.values()),
        "ram_budget_bytes": replica.settings.ram_budget_bytes,
        "max_batch": max_batch,
        **counts,
        "slot_writes": writes.counts(),
        "leftover_pins": pins,
        "config": asdict(cfg),
    }


def churn_ok(summary: dict[str, object]) -> bool:
    """The run's pass: the isolation tally passed and nothing is left pinned."""
    pins = summary["leftover_pins"]
    assert isinstance(pins, dict)
    return bool(summary["ok"]) and not any(pins.values())
