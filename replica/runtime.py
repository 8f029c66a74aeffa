"""Replica: one base model, its adapter cache and its engine, assembled from ReplicaSettings."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from contextlib import AsyncExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from lorafleet.fetch_retry import FetchPolicy
from lorafleet.model.base_hash import base_model_hash
from replica.adapter_cache.assemble import adapter_cache
from replica.adapter_cache.cache import AdapterCache, Lease
from replica.adapter_cache.gpu import GpuTier
from replica.adapter_cache.local_source import FirstFound, LocalRecords, RecordSource
from replica.adapter_cache.merged_fetch import fetch_adapter
from replica.adapter_cache.object_store import ObjectStore
from replica.adapter_cache.registry_client import RegistryClient
from replica.adapter_cache.scrubber import scrub_forever
from replica.config import ReplicaSettings
from replica.control.state_publisher import Load, build_state
from replica.engine.admission_queue import make_queue
from replica.engine.async_engine import AsyncEngine
from replica.engine.engine import KvPolicy, LLMEngine
from replica.engine.model_runner import ModelRunner
from replica.engine.trace import AdmissionTrace
from replica.errors import (
    AdapterBaseMismatchError,
    AdapterNotServedError,
    ContextLengthError,
    InvalidRequestError,
)
from replica.kv.budget import kv_budget_bytes, sequence_blocks
from replica.kv.paged_cache import bytes_per_block
from replica.lifecycle import Lifecycle
from replica.lora.merge import merge_adapter
from replica.lora.registry import AdapterRegistry
from replica.lora.replace import apply_lora
from replica.lora.spec import AdapterSpec
from replica.metrics import EngineLoad, ReplicaMetrics, engine_load
from replica.model.chat_prompt import template_inputs
from replica.model.llama import LlamaForCausalLM
from replica.model.loader import load_model, resolve_device
from replica.model.tokenizer import IncrementalDetokenizer, Tokenizer
from replica.structured.compiler import GrammarCompiler
from schemas.events import ReplicaState
from schemas.replica_api import GenerateRequest, StateResponse

log = logging.getLogger(__name__)


@dataclass
class AdapterUse:
    """How a request runs: the engine's adapter id (None for base or merged), the headers, and its lease."""

    engine_adapter_id: str | None
    header_adapter_id: str | None
    tier: str | None
    lease: Lease | None = field(default=None, repr=False)


@dataclass
class Admitting:
    """Requests past their prompt's tokenizing and not yet in the engine (their adapter being found or
    loaded), and their prompt tokens."""

    requests: int = 0
    prompt_tokens: int = 0

    @contextmanager
    def holding(self, prompt_tokens: int) -> Iterator[None]:
        self.requests += 1
        self.prompt_tokens += prompt_tokens
        try:
            yield
        finally:
            self.requests -= 1
            self.prompt_tokens -= prompt_tokens


class Replica:
    """Everything one replica process serves; the HTTP layer calls only these methods.

    start() (from the event loop) starts the engine thread and opens the adapter cache: the object-store
    client, the registry client and the tiers; stop() closes them. A merged replica opens the same clients
    without the tiers, and serves its adapter once merge() has fetched it and folded it into the weights.
    """

    def __init__(
        self, settings: ReplicaSettings, model: LlamaForCausalLM, tokenizer: Tokenizer | None
    ) -> None:
        self.settings = settings
        self.tokenizer = tokenizer
        self.base_model_hash = settings.base_model_hash or base_model_hash(settings.model_dir)
        self.spec = AdapterSpec.for_model(
            model.config, settings.lora_target_modules, settings.max_lora_rank, self.base_model_hash
        )
        self.local = AdapterRegistry(self.spec, settings.adapter_dirs, settings.adapter_root)
        self.merged_adapter_id = settings.merged_adapter_id
        self.gpu: GpuTier | None = None
        self.model = model
        self.merged = False  # the merged adapter is folded into the weights: its requests are served
        self._merge_from: tuple[RecordSource, ObjectStore] | None = None
        if self.merged_adapter_id is None:
            layers = apply_lora(model, settings.lora_target_modules, settings.lora_slots)
            self.gpu = GpuTier(layers, settings.lora_slots)
        runner = ModelRunner(
            model,
            settings.max_num_seqs,
            settings.max_model_len,
            kv_blocks(settings, model),
            settings.kv_block_size,
            cuda_graphs=settings.cuda_graphs,
        )
        runner.capture_graphs(tuple(sorted(settings.lora_slots)) if self.gpu is not None else ())
        namespace = self.base_model_hash
        if self.merged_adapter_id is not None:  # its weights are the base with that adapter folded in
            namespace = f"{namespace}+merged:{self.merged_adapter_id}"
        kv = KvPolicy(namespace, settings.enable_prefix_caching, settings.enable_chunked_prefill)
        eos = tokenizer.stop_token_ids if tokenizer is not None else set()
        factory = (lambda: IncrementalDetokenizer(tokenizer)) if tokenizer is not None else None
        waiting = make_queue(settings.admission, settings.tenant_row_cap())
        core = LLMEngine(
            runner,
            self.gpu,
            eos,
            settings.max_num_batched_tokens,
            factory,
            waiting,
            prefill_delay_s=settings.fault_prefill_delay_s,
            kv=kv,
        )
        self.engine = AsyncEngine(core)
        self.grammars = (
            GrammarCompiler(tokenizer, settings.schema_limits(), settings.structured_cache_size)
            if tokenizer is not None
            else None
        )
        self.metrics = ReplicaMetrics(Path(settings.model_dir).name)
        self.metrics.watch_engine(self.gpu_slots, self.engine_load)
        self.metrics.watch_holds(self.holds)
        if self.grammars is not None:
            cache = self.grammars.cache
            self.metrics.watch_grammar_cache(lambda: (cache.hits, cache.misses))
        self.cache: AdapterCache | None = None
        self._resources: AsyncExitStack | None = None
        self.lifecycle = Lifecycle()
        self.state_changed = asyncio.Event()  # set on a new status: replica.state goes out at once
        self.running: set[str] = set()  # request ids accepted and not yet answered in full
        self.admitting = Admitting()  # the batch this replica reports counts them as waiting

    @property
    def gpu_slots(self) -> int:
        return sum(self.settings.lora_slots.values()) if self.gpu is not None else 0

    # lifecycle

    async def start(self) -> None:
        """Start the engine thread and open the adapter cache (idempotent)."""
        self.engine.start()
        if self._resources is not None:
            return
        from lorafleet.s3 import async_client

        resources = AsyncExitStack()
        s3 = await resources.enter_async_context(async_client(self.settings.platform))
        policy = FetchPolicy.from_settings(self.settings.platform)
        registry: RegistryClient | None = None
        if self.settings.registry_url is not None:
            registry = RegistryClient.connect(self.settings.registry_url, self.settings.registry_token)
            resources.push_async_callback(registry.close)
        if self.gpu is None:
            local = LocalRecords(self.local.dirs)
            source = FirstFound([local] if registry is None else [local, registry])
            self._merge_from = (source, ObjectStore(s3, local.roots, policy))
            self._resources = resources
            return
        self.cache = adapter_cache(
            self.spec,
            self.gpu,
            self.local.dirs,
            self.settings.cache_path(),
            self.settings.disk_budget_bytes,
            self.settings.ram_budget_bytes,
            s3=s3,
            registry=registry,
            on_event=self.metrics.cache_event,
            policy=policy,
            cold_loads_per_tenant=self.settings.cold_loads_per_tenant,
            cold_loads_total=self.settings.cold_loads_total,
            failure_ttl_s=self.settings.adapter_failure_ttl_s,
        )
        resources.push_async_callback(self.cache.settle)  # finish the disk copies behind loads
        stop_scrub = asyncio.Event()
        interval = self.settings.disk_scrub_interval_s
        scrub = asyncio.create_task(scrub_forever(self.cache, interval, stop_scrub))

        async def end_scrub() -> None:
            stop_scrub.set()
            await scrub

        resources.push_async_callback(end_scrub)
        self._resources = resources

    async def stop(self) -> None:
        self.engine.stop()
        if self._resources is not None:
            await self._resources.aclose()
            self._resources = None

    async def merge(self) -> None:
        """Fetch the merged adapter (checksum verified, every adapter rule applied) and fold it into the
        base weights; idempotent. Until it returns, requests for the adapter are refused."""
        if self.merged or self.merged_adapter_id is None:
            return
        assert self._merge_from is not None, "start() opens the clients merge() fetches with"
        source, store = self._merge_from
        weights = await fetch_adapter(self.merged_adapter_id, source, store, self.spec)
        await asyncio.to_thread(merge_adapter, self.model, weights)
        self.merged = True
        log.info("merged adapter %s into the base weights", self.merged_adapter_id)

    # adapters

    def _cache(self) -> AdapterCache:
        if self.cache is None:
            raise AdapterNotServedError(f"merged replica serves only {self.merged_adapter_id!r}")
        return self.cache

    async def load_adapter(self, adapter_id: str, trained_on_hash: str | None = None) -> tuple[int, float]:
        """Own the adapter and bring it into a GPU slot; return (rank bucket, milliseconds)."""
        cache = self._cache()
        if trained_on_hash is not None and trained_on_hash != self.base_model_hash:
            raise AdapterBaseMismatchError(
                f"adapter trained on base {trained_on_hash}, this replica serves {self.base_model_hash}"
            )
        start = time.perf_counter()
        await cache.own(adapter_id, "gpu")
        entry = cache.gpu.table.lookup(adapter_id)
        bucket = entry.ref.bucket if entry is not None else 0
        return bucket, (time.perf_counter() - start) * 1000

    async def unload_adapter(self, adapter_id: str) -> None:
        """Drop the adapter from every tier once its requests drain."""
        await self._cache().unload(adapter_id)

    async def acquire(self, adapter_id: str | None, tenant_id: str | None = None) -> AdapterUse:
        """Bring the request's adapter into a GPU slot and hold it there until release(); a cold load
        counts against tenant_id's cap."""
        if self.merged_adapter_id is not None:
            if adapter_id != self.merged_adapter_id:
                raise AdapterNotServedError(
                    f"this replica serves only adapter {self.merged_adapter_id!r} (merged)",
                    param="adapter_id",
                )
            if not self.merged:
                raise AdapterNotServedError(f"adapter {adapter_id!r} is not merged yet", param="adapter_id")
            return AdapterUse(None, adapter_id, "gpu")
        if adapter_id is None:
            return AdapterUse(None, None, None)
        lease = await self._cache().acquire(adapter_id, tenant_id)
        return AdapterUse(adapter_id, adapter_id, lease.found_in, lease)

    def release(self, use: AdapterUse) -> None:
        """End a request's hold on its adapter (idempotent)."""
        lease, use.lease = use.lease, None
        if lease is not None and self.cache is not None:
            self.cache.release(lease)

    # requests and state

    def prompt_ids(self, body: GenerateRequest, trace: AdmissionTrace | None = None) -> list[int]:
        """The request's prompt as token ids (GenerateRequest holds exactly one of its three forms); trace
        gets the template's and the tokenizer's marks."""
        if body.prompt_token_ids is not None:
            if trace is not None:
                trace.templated = trace.tokenized = time.perf_counter()
            return body.prompt_token_ids
        param = "messages" if body.messages is not None else "prompt"
        if self.tokenizer is None:
            raise InvalidRequestError("this replica has no tokenizer; send prompt_token_ids", param=param)
        if body.messages is not None:
            messages, tools = template_inputs(
                body.messages, body.tools, body.tool_requirement(), self.tokenizer.renders_tools
            )
            # What can never fit is refused by its length in bytes, before the template or the tokenizer runs.
            self._refuse_by_bytes(sum(len((m.get("content") or "").encode()) for m in messages), param)
            text = self.tokenizer.render_chat(messages, add_generation_prompt=True, tools=tools)
            special = False  # the template writes its special tokens itself
        else:
            assert body.prompt is not None  # the contract's validator: exactly one form was given
            text, special = body.prompt, True
        self._refuse_by_bytes(len(text.encode()), param)
        templated = time.perf_counter()
        ids = self.tokenizer.encode(text, add_special_tokens=special)
        if trace is not None:
            trace.templated, trace.tokenized = templated, time.perf_counter()
        return ids

    def _refuse_by_bytes(self, n_bytes: int, param: str) -> None:
        """A text of more bytes than max_model_len tokens could hold has more tokens than fit."""
        assert self.tokenizer is not None
        limit = self.settings.max_model_len
        if n_bytes > limit * self.tokenizer.max_token_bytes:
            raise ContextLengthError(
                f"This model's maximum context length is {limit} tokens; {n_bytes} bytes of {param} are "
                f"more than {limit} tokens of at most {self.tokenizer.max_token_bytes} bytes can hold",
                param=param,
            )

    def engine_load(self) -> EngineLoad:
        """The engine's running and waiting requests, copied while the engine thread may be stepping."""
        sched = self.engine.engine.scheduler
        for _ in range(10):
            try:
                running, waiting = list(sched.running), list(sched.waiting)
                break
            except RuntimeError:  # the engine thread changed the deque mid-copy: copy again
                continue
        else:
            running, waiting = [], []
        core = self.engine.engine
        return engine_load(
            running, waiting, core.blocks, core.scheduler.counters, core.runner.decode.staging.counts
        )

    def holds(self) -> dict[str, int]:
        """Holds still open: slot refcounts, RAM and disk pins, requests and engine rows, and slots whose
        table entry names another adapter. All zero once every request has ended."""
        core = self.engine.engine
        out = {"requests": len(self.running), "engine_rows": len(core.seqs)}
        cache, gpu = self.cache, self.gpu
        if cache is None or gpu is None:  # not started, or a merged replica: no adapter tiers to pin
            return out | dict.fromkeys(("slot_refs", "ram_pins", "disk_pins", "slot_table_mismatches"), 0)
        entries = gpu.table.entries()
        return out | {
            "slot_refs": sum(e.ref_count for e in entries),
            "ram_pins": sum(cache.host.lru.pins(k) for k in cache.host.lru.keys()),
            "disk_pins": sum(cache.disk.lru.pins(k) for k in cache.disk.lru.keys()),
            "slot_table_mismatches": sum(gpu.table.adapter_at(e.ref) != e.adapter_id for e in entries),
        }

    def load(self) -> Load:
        """The load replica.state reports, from copies of the engine's queues (engine_load)."""
        e = self.engine_load()
        admitting = self.admitting
        return Load(
            queue_depth=e.waiting + admitting.requests,
            tokens_in_flight=e.tokens_in_flight + admitting.prompt_tokens,
            kv_usage=e.kv_usage,
            prefix_cache_queries=e.prefix_cache_queries,
            prefix_cache_hits=e.prefix_cache_hits,
            running=e.running,
            max_running=self.engine.engine.scheduler.max_num_seqs,
            prefill_tokens=e.prefill_tokens + admitting.prompt_tokens,
        )

    def replica_state(self) -> ReplicaState:
        """This replica's replica.state event (tiers, load); a merged replica reports its one adapter."""
        s = self.settings
        life = self.lifecycle
        if self.cache is not None:
            return build_state(
                s.replica_id,
                s.url(),
                life.status,
                self.cache,
                self.gpu_slots,
                self.load(),
                life.owned_adapters,
                life.warm_adapters,
            )
        load = self.load()
        gpu = [self.merged_adapter_id] if self.merged_adapter_id is not None and self.merged else []
        return ReplicaState(
            replica_id=s.replica_id,
            url=s.url(),
            status=life.status,  # a merged replica warms until its adapter is folded in
            gpu_adapters=gpu,
            merged_adapter_id=self.merged_adapter_id,
            queue_depth=load.queue_depth,
            tokens_in_flight=load.tokens_in_flight,
            running=load.running,
            max_running=load.max_running,
            prefill_tokens=load.prefill_tokens,
            kv_usage=load.kv_usage,
            prefix_cache_queries=load.prefix_cache_queries,
            prefix_cache_hits=load.prefix_cache_hits,
        )

    def state(self) -> StateResponse:
        """The body of GET /state: the replica.state fields plus the base model and merged mode."""
        return StateResponse.of(self.replica_state(), self.base_model_hash)


def kv_blocks(settings: ReplicaSettings, model: LlamaForCausalLM) -> int:
    """KV blocks for the budget of the device the model sits on (weights and adapter slots already in)."""
    device, dtype = model.lm_head.weight.device, model.lm_head.weight.dtype
    budget = kv_budget_bytes(device, settings.kv_cache_bytes, settings.gpu_memory_utilization)
    count = sequence_blocks(budget, bytes_per_block(model.config, settings.kv_block_size, dtype))
    log.info("KV cache: %d blocks of %d tokens (%d MiB)", count, settings.kv_block_size, budget >> 20)
    return count


def build_replica(settings: ReplicaSettings) -> Replica:
    """Load the model (and tokenizer when the directory has one) and assemble the replica."""
    dtype = settings.model_dtype(resolve_device(settings.device).type)
    model = load_model(settings.model_dir, dtype, settings.device)
    has_tokenizer = (Path(settings.model_dir) / "tokenizer.json").is_file()
    tokenizer = Tokenizer.from_dir(settings.model_dir) if has_tokenizer else None
    return Replica(settings, model, tokenizer)
