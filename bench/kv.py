"""`lorafleet bench kv-prefix | kv-capacity | kv-stall`: the paged KV cache's figures, as JSON.

- kv-prefix: time to first token of a request whose 1,000-token system prompt (its adapter's own) was
  seen before, prefix cache on against off, on the replica's engine with real LoRA slots; the two modes
  alternate request by request and the medians are compared.
- kv-capacity: how many sequences of a trace's prompt and answer lengths fit one KV budget at once, in
  the block manager's 16-token blocks against contiguous rows of max_model_len positions.
- kv-stall: the longest gap between two tokens of running streams while a long prompt arrives, for each
  prefill chunk budget and unchunked, with the step times that explain it.
"""

from __future__ import annotations

import asyncio
import csv
import random
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._util import environment, sync
from bench.slots import own_in_slots
from harness.adapters import make_peft_adapters
from lorafleet.model.base_hash import base_model_hash
from lorafleet.model.prepare import ensure_default_model
from replica.adapter_cache.gpu import GpuTier
from replica.engine.engine import KvPolicy, LLMEngine
from replica.engine.model_runner import ModelRunner
from replica.engine.sampler import SamplingParams
from replica.kv.blocks import BlockManager
from replica.lora.replace import apply_lora
from replica.lora.spec import AdapterSpec
from replica.model.loader import load_model
from replica.model.tokenizer import Tokenizer

WORDS = (
    "account billing refund order shipping invoice password support plan upgrade device router network "
    "warranty policy customer contract renewal payment delivery return exchange priority escalation"
).split()
TARGETS = ("q_proj", "v_proj")


@dataclass(frozen=True)
class EngineSetup:
    """A replica-shaped engine on the default model: adapters in slots, a KV budget, a token budget."""

    adapters: int = 4
    max_num_seqs: int = 8
    max_model_len: int = 4096
    num_blocks: int | None = None
    max_num_batched_tokens: int = 8192
    kv: KvPolicy = KvPolicy()


@contextmanager
def replica_engine(setup: EngineSetup) -> Iterator[tuple[LLMEngine, Tokenizer]]:
    """The engine and tokenizer, with adapters a0, a1, ... written through the adapter cache."""
    model_dir = ensure_default_model()
    base_hash = base_model_hash(model_dir)
    with tempfile.TemporaryDirectory(prefix="bench-kv-") as tmp:
        names = [f"a{i}" for i in range(setup.adapters)]
        dirs = make_peft_adapters(model_dir, Path(tmp) / "adapters", names, base_hash, rank=16, std=0.02)
        model = load_model(model_dir, "float32", "cpu")
        capacities = {16: max(1, setup.adapters)}
        gpu = GpuTier(apply_lora(model, list(TARGETS), capacities), capacities)
        spec = AdapterSpec.for_model(model.config, list(TARGETS), 16, base_hash)
        asyncio.run(own_in_slots(spec, gpu, dirs, Path(tmp) / "cache"))
        runner = ModelRunner(model, setup.max_num_seqs, setup.max_model_len, setup.num_blocks)
        tokenizer = Tokenizer.from_dir(model_dir)
        kv = KvPolicy(base_hash, setup.kv.prefix_caching, setup.kv.chunked_prefill)
        engine = LLMEngine(runner, gpu, tokenizer.stop_token_ids, setup.max_num_batched_tokens, kv=kv)
        yield engine, tokenizer


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def first_token(
    engine: LLMEngine, request_id: str, prompt: list[int], adapter: str | None
) -> tuple[float, int]:
    """(seconds from queueing the request to its first token, its cached prompt tokens), stepped alone."""
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    start = time.perf_counter()
    engine.add_request(request_id, prompt, params, adapter)
    while True:
        outs = [o for o in engine.step() if o.request_id == request_id]
        if outs:
            sync(engine.runner.device)
            return time.perf_counter() - start, outs[-1].cached_tokens


def prefix_ttft(system_tokens: int = 1000, rounds: int = 5) -> dict[str, Any]:
    """TTFT of a known system prompt plus a new 30-token user message, prefix cache on vs off."""
    with replica_engine(EngineSetup()) as (engine, tokenizer):
        rng = random.Random(0)
        adapters = [f"a{i}" for i in range(4)]
        systems = {}
        for a in adapters:  # each adapter's own system prompt of about system_tokens tokens
            words = text(rng, system_tokens)
            systems[a] = tokenizer.decode(tokenizer.encode(words)[:system_tokens])

        def prompt(a: str) -> list[int]:
            messages = [{"role": "system", "content": systems[a]}, {"role": "user", "content": text(rng, 25)}]
            return tokenizer.apply_chat_template(messages)

        for a in adapters:  # the first request of each adapter fills the cache: not timed
            first_token(engine, f"warm-{a}", prompt(a), a)
        times: dict[str, list[float]] = {"off": [], "on": []}
        cached: dict[str, list[int]] = {"off": [], "on": []}
        n = 0
        for _ in range(rounds):
            for a in adapters:
                for mode in ("off", "on"):
                    engine.blocks.prefix_caching = mode == "on"
                    n += 1
                    seconds, hit = first_token(engine, f"r{n}", prompt(a), a)
                    times[mode].append(seconds)
                    cached[mode].append(hit)
        engine.blocks.prefix_caching = True
        off, on = statistics.median(times["off"]), statistics.median(times["on"])
        return {
            "benchmark": "kv-prefix",
            "prompt_tokens": len(prompt(adapters[0])),
            "system_tokens": system_tokens,
            "samples_per_mode": len(times["on"]),
            "cached_tokens_median": {m: statistics.median(c) for m, c in cached.items()},
            "ttft_ms": {"cache_off_median": round(1000 * off, 1), "cache_on_median": round(1000 * on, 1)},
            "on_over_off": round(on / off, 3),
            "goal_on_over_off_at_most": 0.25,
            "environment": environment(engine.runner.device, "float32"),
        }


def trace_lengths(path: Path) -> list[tuple[int, int]]:
    """(prompt, answer) tokens of every request in a CSV with ContextTokens and GeneratedTokens columns."""
    with path.open(newline="") as f:
        return [(int(r["ContextTokens"]), int(r["GeneratedTokens"])) for r in csv.DictReader(f)]


def capacity(trace: Path, budget_tokens: int, max_model_len: int, draws: int = 50) -> dict[str, Any]:
    """Sequences that fit budget_tokens of KV at once: paged (blocks of 16, whole sequences drawn from
    the trace until the next one no longer fits) against contiguous rows of max_model_len."""
    lengths = [p + a for p, a in trace_lengths(trace) if p + a <= max_model_len]
    rng = random.Random(0)
    fits = []
    for _ in range(draws):
        blocks = BlockManager(budget_tokens // 16, 16, prefix_caching=False)
        n = 0
        while blocks.allocate(f"s{n}", rng.choice(lengths)):
            n += 1
        fits.append(n)
    contiguous = budget_tokens // max_model_len
    paged = statistics.median(fits)
    return {
        "budget_tokens": budget_tokens,
        "max_model_len": max_model_len,
        "trace_requests_that_fit": len(lengths),
        "contiguous_rows": contiguous,
        "paged_sequences_median": paged,
        "paged_sequences_min": min(fits),
        "paged_over_contiguous": round(paged / contiguous, 2) if contiguous else None,
    }


def decode_stall(chunk: int | None, long_prompt: int = 2000, streams: int = 4) -> dict[str, Any]:
    """Streams decode; a long prompt arrives; the longest gap between two tokens of a stream until the
    long prompt's first token, and the step times. chunk None: the prompt is prefilled in one step."""
    kv = KvPolicy(prefix_caching=False, chunked_prefill=chunk is not None)
    setup = EngineSetup(max_num_seqs=streams + 1, max_num_batched_tokens=chunk or 8192, kv=kv)
    with replica_engine(setup) as (engine, _):
        rng = random.Random(1)
        params = SamplingParams(temperature=0.0, max_tokens=4000, ignore_eos=True)
        for i in range(streams):
            engine.add_request(f"s{i}", [rng.randrange(100, 40000) for _ in range(20)], params, f"a{i % 4}")
        for _ in range(3):  # every stream is decoding
            engine.step()
        last = {f"s{i}": time.perf_counter() for i in range(streams)}
        gaps: list[float] = []
        steps: list[tuple[float, int]] = []
        first = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
        engine.add_request("long", [rng.randrange(100, 40000) for _ in range(long_prompt)], first, "a0")
        arrived = time.perf_counter()
        while True:
            start = time.perf_counter()
            outs = engine.step()
            now = time.perf_counter()
            steps.append((now - start, sum(1 for o in outs if o.request_id == "long")))
            for o in outs:
                if o.request_id in last:
                    gaps.append(now - last[o.request_id])
                    last[o.request_id] = now
            if any(o.request_id == "long" for o in outs):
                break
        prefill_steps = [s for s, _ in steps]
        return {
            "chunk_tokens": chunk,
            "longest_stream_gap_ms": round(1000 * max(gaps), 1),
            "step_ms_median": round(1000 * statistics.median(prefill_steps), 1),
            "step_ms_max": round(1000 * max(prefill_steps), 1),
            "steps_until_long_prompt_first_token": len(steps),
            "long_prompt_ttft_ms": round(1000 * (time.perf_counter() - arrived), 1),
        }


def stall(chunks: tuple[int, ...], long_prompt: int = 2000, repeats: int = 3) -> dict[str, Any]:
    """decode_stall for each chunk budget and unchunked, in interleaved rounds; medians per budget."""
    budgets: list[int | None] = [*chunks, None]
    samples: dict[int | None, list[dict[str, Any]]] = {b: [] for b in budgets}
    for _ in range(repeats):
        for b in budgets:
            samples[b].append(decode_stall(b, long_prompt))
    keys = ("longest_stream_gap_ms", "step_ms_median", "step_ms_max", "long_prompt_ttft_ms")
    runs = []
    for b in budgets:
        row: dict[str, Any] = {"chunk_tokens": b, "repeats": repeats}
        row |= {k: round(statistics.median(s[k] for s in samples[b]), 1) for k in keys}
        row["steps_until_long_prompt_first_token"] = samples[b][0]["steps_until_long_prompt_first_token"]
        # the property chunking gives: no stream waits longer than the longest step it ran beside
        row["gap_over_own_max_step_max"] = max(
            round(s["longest_stream_gap_ms"] / s["step_ms_max"], 3) for s in samples[b]
        )
        runs.append(row)
    unchunked = runs[-1]
    for row in runs:
        row["gap_over_unchunked"] = round(
            row["longest_stream_gap_ms"] / unchunked["longest_stream_gap_ms"], 3
        )
        row["ttft_over_unchunked"] = round(row["long_prompt_ttft_ms"] / unchunked["long_prompt_ttft_ms"], 3)
    return {"benchmark": "kv-stall", "long_prompt_tokens": long_prompt, "runs": runs}
