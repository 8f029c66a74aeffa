"""`lorafleet bench engine`: decode tokens/s of our engine on SmolLM2 with 0, 1, 8 and 32 distinct adapters.

In the same run and on the same 32 prompts it measures transformers generate (batch 32, no adapters) and
PEFT mixed-adapter generate (adapter_names=...), and reports ratios against our own base run, peak memory,
and how often greedy tokens agree with the references. Decode time runs from the step where every row has
its first token to the last token; prefill is reported apart (and written to the calibration file).
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from bench._util import cuda_peak_mib, environment, median, peak_rss_mib, reset_cuda_peak, sync
from bench.hf_baselines import ALL_TARGETS, adapter_dir, load_hf_model, make_peft_adapters, timed_generate
from bench.slots import own_in_slots
from lorafleet.model.base_hash import base_model_hash
from lorafleet.model.prepare import DEFAULT_MODEL_NAME, ensure_default_model
from replica.adapter_cache.gpu import GpuTier
from replica.engine.engine import LLMEngine
from replica.engine.model_runner import ModelRunner
from replica.engine.sampler import SamplingParams
from replica.lora.replace import apply_lora
from replica.lora.spec import AdapterSpec
from replica.model.loader import load_model
from replica.model.tokenizer import IncrementalDetokenizer, Tokenizer

log = logging.getLogger(__name__)

TOPICS = [
    "the water cycle", "how a bicycle stays upright", "photosynthesis", "the history of the printing press",
    "why the sky is blue", "how vaccines work", "the rules of chess", "how to bake bread",
    "black holes", "the French revolution", "how compilers work", "plate tectonics",
    "the immune system", "how airplanes fly", "the stock market", "climate change",
    "the Roman empire", "how batteries store energy", "machine learning", "volcanoes",
    "the human heart", "how the internet routes packets", "coral reefs", "the moon landing",
    "how bees make honey", "quantum computing", "the Renaissance", "earthquakes",
    "how a refrigerator works", "the solar system", "DNA replication", "the Silk Road",
]  # fmt: skip
TARGETS = {"adapters32_over_base": 0.85, "base_over_transformers": 1.5, "adapters32_over_peft_mixed": 5.0}


@dataclass(frozen=True)
class EngineBenchConfig:
    """Sizes of the run; the defaults finish in a few minutes on 2 CPU cores."""

    new_tokens: int = 32
    rounds: int = 2
    batch: int = 32
    rank: int = 16
    distinct: tuple[int, ...] = (0, 1, 8, 32)
    dtype: str = "float32"
    device: str = "cpu"
    model_dir: Path | None = None


@dataclass
class EngineRun:
    """Step timings of one batch run through our engine."""

    prefill_s: float = 0.0
    prefill_tokens: int = 0
    decode_step_s: list[float] = field(default_factory=list)
    tokens: dict[str, list[int]] = field(default_factory=dict)

    @property
    def decode_tokens_per_s(self) -> float:
        steps, batch = len(self.decode_step_s), len(self.tokens)
        return steps * batch / sum(self.decode_step_s) if steps else float("nan")


def chat_prompts(tokenizer: Tokenizer, batch: int) -> list[list[int]]:
    """`batch` distinct chat prompts, rendered with the model's own template."""
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": f"Explain {TOPICS[i % len(TOPICS)]} briefly."}]
        )
        for i in range(batch)
    ]


def build_engine(
    model_dir: Path,
    adapters: dict[str, Path],
    cfg: EngineBenchConfig,
    tokenizer: Tokenizer,
    base_hash: str,
    max_prompt: int,
    cache_dir: Path,
) -> LLMEngine:
    """Our engine with one rank pool holding every adapter in a slot (loaded through the adapter cache before
    timing)."""
    model = load_model(model_dir, cfg.dtype, cfg.device)
    capacities = {cfg.rank: max(len(adapters), 1)}
    gpu = GpuTier(apply_lora(model, ALL_TARGETS, capacities), capacities)
    spec = AdapterSpec.for_model(model.config, ALL_TARGETS, cfg.rank, base_hash)
    asyncio.run(own_in_slots(spec, gpu, adapters, cache_dir))
    runner = ModelRunner(model, max_num_seqs=cfg.batch, max_model_len=max_prompt + cfg.new_tokens + 1)
    return LLMEngine(
        runner,
        gpu,
        tokenizer.stop_token_ids,
        max_num_batched_tokens=1 << 16,  # admit the whole batch's prefill in one step
        detokenizer_factory=lambda: IncrementalDetokenizer(tokenizer),
    )


def run_engine(
    engine: LLMEngine, prompts: list[list[int]], adapter_ids: list[str | None], new_tokens: int
) -> EngineRun:
    """Submit every prompt at once and step to the end, timing each step."""
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    for i, (prompt, adapter) in enumerate(zip(prompts, adapter_ids, strict=True)):
        engine.add_request(f"r{i}", prompt, params, adapter)
    run = EngineRun(tokens={f"r{i}": [] for i in range(len(prompts))})
    device = engine.runner.device
    first = True
    while engine.has_work():
        sync(device)
        start = time.perf_counter()
        outputs = engine.step()
        sync(device)
        elapsed = time.perf_counter() - start
        for o in outputs:
            if o.token_id is not None:
                run.tokens[o.request_id].append(o.token_id)
        if first:  # the whole batch was admitted: this step prefilled every prompt
            run.prefill_s, run.prefill_tokens = elapsed, sum(len(p) for p in prompts)
            first = False
        else:
            run.decode_step_s.append(elapsed)
    return run


def agreement(a: list[list[int]], b: list[list[int]]) -> float:
    """Fraction of rows whose greedy tokens are identical."""
    return sum(x == y for x, y in zip(a, b, strict=True)) / len(a)


def _cuda_peak_during(device: torch.device, fn: Callable[[], Any]) -> tuple[Any, float | None]:
    """Run fn; return its result and the extra GPU memory it needed at peak (None on CPU)."""
    reset_cuda_peak(device)
    before = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    value = fn()
    peak = cuda_peak_mib(device)
    return value, None if peak is None else round(peak - before / (1 << 20), 1)


def weight_bytes_per_step(engine: LLMEngine, rank: int, distinct: int) -> dict[str, float]:
    """Bytes a decode step must read: the base's matmul weights, and `distinct` adapters' A and B.

    On hardware where decode is memory-bound, 1 / (1 + adapters / base) is the best ratio of D-adapter
    to base throughput any implementation can reach; with small bases the adapters can outweigh the base.
    """
    model = engine.runner.model
    item = model.lm_head.weight.element_size()
    base = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear)) * item
    spec = AdapterSpec.for_model(model.config, ALL_TARGETS, rank, "")
    per_adapter = spec.num_layers * sum(rank * (k + d) for k, d in spec.shapes.values()) * item
    return {
        "base_mib": round(base / (1 << 20), 1),
        "adapter_mib": round(per_adapter / (1 << 20), 2),
        "memory_bound_ceiling": round(1 / (1 + distinct * per_adapter / base), 3),
    }


def run_engine_bench(cfg: EngineBenchConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    """Measure ours (per D), transformers and PEFT mixed; return (result JSON, calibration JSON).

    Every variant runs once per round and rounds interleave the variants, so a noisy neighbour slows
    them alike; the reported tokens/s is each variant's median over rounds.
    """
    device = torch.device(cfg.device)
    model_dir = ensure_default_model(cfg.model_dir)
    base_hash = base_model_hash(model_dir)
    tokenizer = Tokenizer.from_dir(model_dir)
    prompts = chat_prompts(tokenizer, cfg.batch)
    pad_id = next(iter(tokenizer.stop_token_ids))
    max_d = max(cfg.distinct)
    names = [f"a{i % max(max_d, 1)}" for i in range(cfg.batch)]

    with tempfile.TemporaryDirectory(prefix="bench-adapters-") as tmp:
        log.info("creating %d PEFT adapters (rank %d)", max_d, cfg.rank)
        peft_model = make_peft_adapters(
            load_hf_model(model_dir, cfg.dtype, device), Path(tmp), max(max_d, 1), cfg.rank, base_hash
        )
        adapters = {f"a{i}": adapter_dir(Path(tmp), f"a{i}") for i in range(max(max_d, 1))}
        max_prompt = max(len(p) for p in prompts)
        engine = build_engine(model_dir, adapters, cfg, tokenizer, base_hash, max_prompt, Path(tmp) / "cache")
        hf = load_hf_model(model_dir, cfg.dtype, device)
    rss_after_load = peak_rss_mib()

    def ours(d: int) -> Callable[[int, int], Any]:
        ids = [None if d == 0 else f"a{i % d}" for i in range(cfg.batch)]
        return lambda rows, n: run_engine(engine, prompts[:rows], ids[:rows], n)

    variants: dict[str, Callable[[int, int], Any]] = {
        **{f"ours_{d}_adapters": ours(d) for d in cfg.distinct},
        "transformers_generate": lambda rows, n: timed_generate(hf, prompts[:rows], n, pad_id, device),
        "peft_mixed_generate": lambda rows, n: timed_generate(
            peft_model, prompts[:rows], n, pad_id, device, names[:rows]
        ),
    }
    for name, fn in variants.items():  # warm-up on two rows: first calls allocate and pick kernels
        log.info("warm-up %s", name)
        fn(2, 2)
    runs: dict[str, list[Any]] = {name: [] for name in variants}
    cuda_extra: dict[str, float | None] = {}
    for r in range(cfg.rounds):
        for name, fn in variants.items():
            run, cuda_extra[name] = _cuda_peak_during(device, partial(fn, cfg.batch, cfg.new_tokens))
            runs[name].append(run)
            log.info("round %d %s: %.1f decode tok/s", r, name, run.decode_tokens_per_s)

    tps = {name: median([x.decode_tokens_per_s for x in rs]) for name, rs in runs.items()}
    base = tps.get("ours_0_adapters", float("nan"))
    top = tps[f"ours_{max_d}_adapters"]
    ratios = {
        "adapters32_over_base": top / base,
        "base_over_transformers": base / tps["transformers_generate"],
        "adapters32_over_peft_mixed": top / tps["peft_mixed_generate"],
    }

    def rows(name: str) -> list[list[int]]:
        last = runs[name][-1]
        return (
            [last.tokens[f"r{i}"] for i in range(cfg.batch)] if isinstance(last, EngineRun) else last.tokens
        )

    result = {
        "benchmark": "engine",
        "environment": environment(device, cfg.dtype),
        "model": {"dir": str(model_dir), "base_model_hash": base_hash},
        "config": {
            "batch": cfg.batch,
            "new_tokens": cfg.new_tokens,
            "rounds": cfg.rounds,
            "rank": cfg.rank,
            "prompt_tokens": [len(p) for p in prompts],
            "peft_mixed_adapters": max_d,
            "timing": "decode only (every row's first token to its last), median over interleaved rounds",
        },
        "decode_tokens_per_s": {name: round(v, 2) for name, v in tps.items()},
        "ratios": {k: round(v, 3) for k, v in ratios.items()},
        "weight_bytes_per_decode_step": weight_bytes_per_step(engine, cfg.rank, max_d),
        "targets": TARGETS,
        "meets_targets": {k: ratios[k] >= t for k, t in TARGETS.items()},
        "greedy_rows_identical": {
            "ours_base_vs_transformers": agreement(rows("ours_0_adapters"), rows("transformers_generate"))
            if 0 in cfg.distinct
            else None,
            f"ours_{max_d}_vs_peft_mixed": agreement(
                rows(f"ours_{max_d}_adapters"), rows("peft_mixed_generate")
            ),
        },
        "memory": {
            "peak_rss_mib_after_loading": round(rss_after_load, 1),
            "peak_rss_mib": round(peak_rss_mib(), 1),
            "rss_note": "one process holds all three models; RSS is the process peak",
            "cuda_peak_extra_mib_per_run": cuda_extra if device.type == "cuda" else None,
            "cuda_max_allocated_mib": cuda_peak_mib(device),
        },
    }
    return result, calibration(cfg, device, {d: runs[f"ours_{d}_adapters"] for d in cfg.distinct})


def calibration(
    cfg: EngineBenchConfig, device: torch.device, ours: dict[int, list[EngineRun]]
) -> dict[str, Any]:
    """Decode step times and prefill throughput of our engine, for the fleet simulator's timing model."""
    mean_prompt = next(iter(ours.values()))[0].prefill_tokens / cfg.batch
    return {
        "model": DEFAULT_MODEL_NAME,
        "environment": environment(device, cfg.dtype),
        "batch": cfg.batch,
        "new_tokens": cfg.new_tokens,
        "prompt_tokens_mean": mean_prompt,
        "decode_step_s": {
            str(d): {
                "median": median([s for r in rs for s in r.decode_step_s]),
                "samples": [round(s, 6) for r in rs for s in r.decode_step_s],
            }
            for d, rs in ours.items()
        },
        "prefill": {
            str(d): {
                "tokens": rs[0].prefill_tokens,
                "median_s": median([r.prefill_s for r in rs]),
                "tokens_per_s": rs[0].prefill_tokens / median([r.prefill_s for r in rs]),
            }
            for d, rs in ours.items()
        },
    }
