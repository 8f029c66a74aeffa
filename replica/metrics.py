"""Replica Prometheus metrics: vLLM's names (so routers, KEDA and dashboards read us unchanged) and ours.

Gauges are read from the engine at scrape time by a collector; counters and histograms are updated where
tokens are streamed and where the adapter cache reports loads and evictions. Each app has its own
registry, so several replicas can live in one test process. Adapters never become a label except inside
vllm:lora_requests_info, whose comma-separated label values are the GIE protocol (ecosystem.md 3.2).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from lorafleet.dead_letters import dead_letter_counter
from replica.adapter_cache.tier import CacheEvent

if TYPE_CHECKING:  # only annotations: reading the metrics module must not import torch
    from replica.engine.scheduler import CacheCounters
    from replica.engine.sequence import Sequence
    from replica.engine.trace import AdmissionTrace
    from replica.kv.blocks import BlockManager

# vLLM's TTFT buckets, extended for a CPU replica
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0)
STAGE_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.02,
    0.05,
    0.1,
    0.2,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0)


@dataclass(frozen=True)
class EngineLoad:
    """What the engine holds right now."""

    running: int
    waiting: int
    kv_usage: float  # KV blocks held by sequences / blocks the cache has (cached free blocks are free), 0-1
    tokens_in_flight: int
    running_adapters: tuple[str, ...]
    waiting_adapters: tuple[str, ...]
    kv_blocks: int = 0
    block_size: int = 0
    prefix_caching: bool = False
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache since start
    prefix_cache_hits: int = 0  # and found there
    preemptions: int = 0
    prefill_tokens: int = 0  # tokens of waiting and running sequences not yet prefilled
    staged_ahead_used: int = 0  # decode steps that kept what was staged for them while the last one ran
    staged_ahead_missed: int = 0  # and those that had to build it again (rows ended or joined)


def engine_load(
    running: Iterable[Sequence],
    waiting: Iterable[Sequence],
    blocks: BlockManager,
    counters: CacheCounters,
    staging: Mapping[str, int] | None = None,
) -> EngineLoad:
    """Summarise the scheduler's running and waiting sequences (copies taken by the caller) and its blocks;
    staging: the decode step's staging counts (replica.engine.decode_staging)."""
    run, wait = list(running), list(waiting)
    staged = staging or {}
    return EngineLoad(
        staged_ahead_used=staged.get("ahead_used", 0),
        staged_ahead_missed=staged.get("ahead_missed", 0),
        running=len(run),
        waiting=len(wait),
        kv_usage=1.0 - blocks.num_free / blocks.num_blocks,
        kv_blocks=blocks.num_blocks,
        block_size=blocks.block_size,
        prefix_caching=blocks.prefix_caching,
        prefix_cache_queries=counters.queries,
        prefix_cache_hits=counters.hits,
        preemptions=counters.preemptions,
        tokens_in_flight=sum(s.num_tokens for s in run) + sum(s.num_tokens for s in wait),
        # a decoding row has its one new token uncomputed; a prefilling one, the rest of its prompt
        prefill_tokens=sum(s.num_uncomputed for s in run if s.num_uncomputed > 1)
        + sum(s.num_uncomputed for s in wait),
        running_adapters=tuple(sorted({s.adapter_id for s in run if s.adapter_id is not None})),
        waiting_adapters=tuple(sorted({s.adapter_id for s in wait if s.adapter_id is not None})),
    )


class EngineGauges(Collector):
    """vllm:num_requests_*, vllm:kv_cache_usage_perc, vllm:lora_requests_info and tokens in flight."""

    def __init__(
        self,
        model_name: str,
        max_lora: int,
        read: Callable[[], EngineLoad],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.model_name, self.max_lora, self.read, self.clock = model_name, max_lora, read, clock

    def collect(self) -> Iterator[Metric]:
        load = self.read()
        m = [self.model_name]
        for name, doc, value in (
            ("vllm:num_requests_running", "Requests in the running batch.", load.running),
            ("vllm:num_requests_waiting", "Requests waiting to be scheduled.", load.waiting),
            ("vllm:kv_cache_usage_perc", "KV-cache usage, 0-1.", load.kv_usage),
            (
                "lorafleet_replica_tokens_in_flight",
                "Prompt and generated tokens of running requests plus prompts of waiting ones.",
                load.tokens_in_flight,
            ),
        ):
            g = GaugeMetricFamily(name, doc, labels=["model_name"])
            g.add_metric(m, value)
            yield g
        for name, doc, total in (
            (
                "vllm:prefix_cache_queries",
                "Prompt tokens looked up in the prefix cache.",
                load.prefix_cache_queries,
            ),
            ("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.", load.prefix_cache_hits),
            (
                "vllm:num_preemptions",
                "Requests preempted to free KV blocks (recomputed later).",
                load.preemptions,
            ),
        ):
            c = CounterMetricFamily(name, doc, labels=["model_name"])
            c.add_metric(m, total)
            yield c
        staged = CounterMetricFamily(
            "lorafleet_replica_decode_staged_ahead",
            "Decode steps staged while the step before ran (CUDA): kept (used) or built again (missed).",
            labels=["model_name", "outcome"],
        )
        staged.add_metric([*m, "used"], load.staged_ahead_used)
        staged.add_metric([*m, "missed"], load.staged_ahead_missed)
        yield staged
        config = GaugeMetricFamily(
            "vllm:cache_config_info",
            "The KV cache's configuration in labels; the value is 1.",
            labels=["block_size", "num_gpu_blocks", "enable_prefix_caching"],
        )
        config.add_metric([str(load.block_size), str(load.kv_blocks), str(load.prefix_caching)], 1)
        yield config
        info = GaugeMetricFamily(
            "vllm:lora_requests_info",
            "Running and waiting LoRA adapters (comma-separated); the value is the update time.",
            labels=["max_lora", "running_lora_adapters", "waiting_lora_adapters"],
        )
        running, waiting = ",".join(load.running_adapters), ",".join(load.waiting_adapters)
        info.add_metric([str(self.max_lora), running, waiting], self.clock())
        yield info


class HoldGauges(Collector):
    """lorafleet_replica_holds{kind}: pins, refcounts, requests and engine rows held now (0 when idle)."""

    def __init__(self, read: Callable[[], dict[str, int]]) -> None:
        self.read = read

    def collect(self) -> Iterator[Metric]:
        g = GaugeMetricFamily(
            "lorafleet_replica_holds",
            "Holds open now by kind: slot_refs, ram_pins, disk_pins, requests, engine_rows and "
            "slot_table_mismatches; every kind is 0 once every request has ended.",
            labels=["kind"],
        )
        for kind, value in sorted(self.read().items()):
            g.add_metric([kind], value)
        yield g


class GrammarCacheCounters(Collector):
    """lorafleet_replica_grammar_cache_total{result}: response_format schemas found compiled (hit) or
    compiled anew (miss)."""

    def __init__(self, read: Callable[[], tuple[int, int]]) -> None:
        self.read = read

    def collect(self) -> Iterator[Metric]:
        c = CounterMetricFamily(
            "lorafleet_replica_grammar_cache",
            "response_format schemas by whether their grammar was cached (hit) or compiled (miss).",
            labels=["result"],
        )
        hits, misses = self.read()
        c.add_metric(["hit"], hits)
        c.add_metric(["miss"], misses)
        yield c


class ReplicaMetrics:
    """One set per app, in its own registry."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.registry = CollectorRegistry()
        r, m = self.registry, ["model_name"]
        self.dead_letters = dead_letter_counter(r)
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Time from request arrival to its first token.",
            m,
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Time between output tokens.",
            m,
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.admission = Histogram(
            "lorafleet_replica_admission_seconds",
            "Time a request spends in each stage from arrival to its first token (stage: see STAGES).",
            ["stage"],
            buckets=STAGE_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens processed.", m, registry=r)
        self.generation_tokens = Counter("vllm:generation_tokens", "Tokens generated.", m, registry=r)
        self.request_success = Counter(
            "vllm:request_success", "Finished requests by reason.", m + ["finished_reason"], registry=r
        )
        self.hits = Counter(
            "lorafleet_replica_adapter_hits",
            "Requests by the tier their adapter was found in on arrival.",
            ["tier"],
            registry=r,
        )
        self.loads = Counter(
            "lorafleet_replica_adapter_loads",
            "Adapter copies between tiers (to_tier=gpu: into a GPU slot).",
            ["from_tier", "to_tier"],
            registry=r,
        )
        self.evictions = Counter(
            "lorafleet_replica_adapter_evictions", "Adapter evictions by tier.", ["tier"], registry=r
        )

    def watch_engine(self, max_lora: int, read: Callable[[], EngineLoad]) -> None:
        """Register the scrape-time engine gauges."""
        self.registry.register(EngineGauges(self.model_name, max_lora, read))

    def watch_holds(self, read: Callable[[], dict[str, int]]) -> None:
        """Register the scrape-time holds gauge (read: Replica.holds)."""
        self.registry.register(HoldGauges(read))

    def watch_grammar_cache(self, read: Callable[[], tuple[int, int]]) -> None:
        """Register the scrape-time grammar cache counters (read: hits, misses)."""
        self.registry.register(GrammarCacheCounters(read))

    def cache_event(self, e: CacheEvent) -> None:
        """The adapter cache's event sink."""
        if e.kind == "load":
            self.loads.labels(e.from_tier or "none", e.to_tier or "none").inc()
        else:
            self.evictions.labels(e.from_tier or "none").inc()

    def request(self) -> RequestTimer:
        """Start timing a request that arrived now (before its adapter is brought in)."""
        return RequestTimer(self)

    def admitted(self, trace: AdmissionTrace) -> None:
        """Observe each stage of a request whose first token has been handed back."""
        for stage, seconds in trace.stages().items():
            self.admission.labels(stage).observe(seconds)

    def hit(self, tier: str) -> None:
        """A request's adapter was found in `tier` on arrival."""
        self.hits.labels(tier).inc()


class RequestTimer:
    """Observes TTFT and inter-token latency as one request's tokens are streamed."""

    def __init__(self, metrics: ReplicaMetrics, clock: Callable[[], float] = time.perf_counter) -> None:
        self.metrics, self.clock = metrics, clock
        self.arrived = clock()
        self.last: float | None = None

    def token(self) -> None:
        now = self.clock()
        name = self.metrics.model_name
        if self.last is None:
            self.metrics.ttft.labels(name).observe(now - self.arrived)
        else:
            self.metrics.itl.labels(name).observe(now - self.last)
        self.last = now

    def finished(self, reason: str | None, prompt_tokens: int, completion_tokens: int) -> None:
        name = self.metrics.model_name
        self.metrics.prompt_tokens.labels(name).inc(prompt_tokens)
        self.metrics.generation_tokens.labels(name).inc(completion_tokens)
        self.metrics.request_success.labels(name, reason or "unknown").inc()
