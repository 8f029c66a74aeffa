"""`lorafleet bench constrained`: the cost of response_format on our engine with SmolLM2.

Decode tokens/s of a batch where some rows follow a JSON schema (their logits masked every step) against
the same batch with no grammar, in one run with the variants interleaved (medians over rounds); and the
time to first token of one request with a schema never seen (compiled first) against one already cached.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bench._util import environment, median, sync
from lorafleet.model.prepare import ensure_default_model
from replica.engine.engine import LLMEngine
from replica.engine.model_runner import ModelRunner
from replica.engine.sampler import SamplingParams
from replica.model.loader import load_model
from replica.model.tokenizer import IncrementalDetokenizer, Tokenizer
from replica.structured.compiler import GrammarCompiler
from schemas.response_format import SchemaLimits

# long enough that no row completes its JSON within a run: every row decodes every step
RECORDS = {
    "type": "object",
    "properties": {
        "records": {
            "type": "array",
            "minItems": 64,
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "score": {"type": "number"},
                    "tags": {"type": "array", "items": {"type": "string"}},
                },
                "required": ["name", "score", "tags"],
            },
        }
    },
    "required": ["records"],
}
TARGET = 0.9  # constrained over plain decode tokens/s


@dataclass(frozen=True)
class ConstrainedBenchConfig:
    """Sizes of the run; the defaults finish in a few minutes on 2 CPU cores."""

    batch: int = 32
    constrained: int = 8  # rows under the schema in the constrained variant
    new_tokens: int = 16
    rounds: int = 3
    ttft_repeats: int = 5
    dtype: str = "float32"
    device: str = "cpu"
    model_dir: Path | None = None


def _prompts(tokenizer: Tokenizer, batch: int) -> list[list[int]]:
    ask = "List people with a score and tags, as JSON. Request {}."
    return [tokenizer.apply_chat_template([{"role": "user", "content": ask.format(i)}]) for i in range(batch)]


def _decode_rate(
    engine: LLMEngine, compiler: GrammarCompiler, prompts: list[list[int]], constrained: int, new_tokens: int
) -> float:
    """Tokens/s of the median decode step (every step after the one that prefilled the whole batch): a
    median, so that a burst of other work on the machine moves it less than a sum would."""
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        grammar = compiler.matcher(RECORDS) if i < constrained else None
        engine.add_request(f"r{i}", prompt, params, grammar=grammar)
    device = engine.runner.device
    engine.step()  # the prefill
    rates = []
    while engine.has_work():
        sync(device)
        start = time.perf_counter()
        outputs = engine.step()
        sync(device)
        rates.append(sum(o.token_id is not None for o in outputs) / (time.perf_counter() - start))
    return median(rates)


def _first_token_s(
    engine: LLMEngine, compiler: GrammarCompiler, prompt: list[int], schema: dict
) -> tuple[float, float]:
    """Seconds from the schema to the request's first token (compile or cache hit, admit, prefill), and of
    that the grammar's part."""
    device = engine.runner.device
    sync(device)
    start = time.perf_counter()
    grammar = compiler.matcher(schema)
    compiled = time.perf_counter() - start
    engine.add_request("ttft", prompt, SamplingParams(temperature=0.0, max_tokens=1), grammar=grammar)
    while not any(o.token_id is not None for o in engine.step()):
        pass
    sync(device)
    elapsed = time.perf_counter() - start
    while engine.has_work():
        engine.step()
    return elapsed, compiled


def run_constrained_bench(cfg: ConstrainedBenchConfig) -> dict[str, Any]:
    """Plain and constrained decode tokens/s (interleaved rounds), and first-token times new vs cached."""
    device = torch.device(cfg.device)
    model_dir = ensure_default_model(cfg.model_dir)
    tokenizer = Tokenizer.from_dir(model_dir)
    prompts = _prompts(tokenizer, cfg.batch)
    model = load_model(model_dir, cfg.dtype, cfg.device)
    runner = ModelRunner(
        model, max_num_seqs=cfg.batch, max_model_len=max(map(len, prompts)) + cfg.new_tokens + 1
    )
    engine = LLMEngine(
        runner,
        None,
        tokenizer.stop_token_ids,
        max_num_batched_tokens=1 << 16,  # the whole batch's prefill in one step
        detokenizer_factory=lambda: IncrementalDetokenizer(tokenizer),
    )
    compiler = GrammarCompiler(tokenizer, SchemaLimits())
    _decode_rate(engine, compiler, prompts, cfg.constrained, 3)  # warm-up: allocator, kernels, the grammar
    rates: dict[str, list[float]] = {"plain": [], "constrained": []}
    for _ in range(cfg.rounds):
        rates["plain"].append(_decode_rate(engine, compiler, prompts, 0, cfg.new_tokens))
        rates["constrained"].append(_decode_rate(engine, compiler, prompts, cfg.constrained, cfg.new_tokens))
    plain, constrained = median(rates["plain"]), median(rates["constrained"])
    new: list[tuple[float, float]] = []
    cached: list[tuple[float, float]] = []
    for i in range(cfg.ttft_repeats):
        schema = RECORDS | {"description": f"never seen {i}"}
        new.append(_first_token_s(engine, compiler, prompts[0], schema))
        cached.append(_first_token_s(engine, compiler, prompts[0], schema))
    return {
        "benchmark": "constrained",
        "environment": environment(device, cfg.dtype),
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in cfg.__dict__.items()},
        "decode_tokens_per_s": {"plain": round(plain, 1), "constrained": round(constrained, 1)},
        "constrained_over_plain": round(constrained / plain, 3),
        "target": TARGET,
        "meets_target": constrained / plain >= TARGET,
        "first_token_ms": {
            "new_schema": round(median([t for t, _ in new]) * 1e3, 1),
            "cached_schema": round(median([t for t, _ in cached]) * 1e3, 1),
        },
        "grammar_ms": {
            "new_schema": round(median([g for _, g in new]) * 1e3, 2),
            "cached_schema": round(median([g for _, g in cached]) * 1e3, 2),
        },
        "grammar_cache": {"hits": compiler.cache.hits, "misses": compiler.cache.misses},
    }
