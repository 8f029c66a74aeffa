"""The workload generator's distributions, with fixed seeds and tolerant bounds."""

from __future__ import annotations

import statistics
from collections import Counter
from pathlib import Path

from sim.workload import WorkloadConfig, adapter_id, generate, load, save, zipf_weights

CFG = WorkloadConfig(adapters=500, rate=40.0, zipf_s=1.0, duration_s=600.0, seed=7)


def test_lengths_are_log_normal_with_the_briefs_means() -> None:
    trace = generate(CFG)
    prompts = [r.prompt_tokens for r in trace]
    outputs = [r.output_tokens for r in trace]
    assert abs(statistics.mean(prompts) / 750 - 1) < 0.03
    assert abs(statistics.mean(outputs) / 250 - 1) < 0.03
    # log-normal: right-skewed, the median below the mean
    assert statistics.median(prompts) < 0.9 * statistics.mean(prompts)
    assert min(prompts) >= 1 and max(prompts) <= CFG.max_tokens


def test_arrivals_are_poisson_at_the_rate() -> None:
    trace = generate(CFG)
    assert abs(len(trace) / (CFG.rate * CFG.duration_s) - 1) < 0.03
    gaps = [b.arrival_s - a.arrival_s for a, b in zip(trace, trace[1:], strict=False)]
    mean = statistics.mean(gaps)
    assert abs(mean * CFG.rate - 1) < 0.03
    assert abs(statistics.pstdev(gaps) / mean - 1) < 0.05  # exponential gaps: coefficient of variation 1
    assert all(g >= 0 for g in gaps)


def test_popularity_follows_zipf() -> None:
    trace = generate(CFG)
    counts = Counter(r.adapter_id for r in trace)
    weights = zipf_weights(CFG.adapters, CFG.zipf_s)
    for rank in (0, 1, 9):
        assert abs(counts[adapter_id(rank)] / len(trace) / weights[rank] - 1) < 0.1
    top_decile = sum(counts[adapter_id(i)] for i in range(CFG.adapters // 10)) / len(trace)
    assert abs(top_decile - sum(weights[: CFG.adapters // 10])) < 0.02


def test_higher_exponent_is_more_skewed() -> None:
    def top_share(s: float) -> float:
        trace = generate(WorkloadConfig(adapters=500, rate=20.0, zipf_s=s, duration_s=300.0, seed=1))
        return Counter(r.adapter_id for r in trace).most_common(1)[0][1] / len(trace)

    assert top_share(1.2) > top_share(1.0) > top_share(0.6)


def test_trace_is_deterministic_from_the_seed() -> None:
    small = WorkloadConfig(adapters=50, rate=5.0, duration_s=60.0, seed=3)
    assert generate(small) == generate(small)
    assert generate(small) != generate(WorkloadConfig(adapters=50, rate=5.0, duration_s=60.0, seed=4))


def test_trace_round_trips_through_jsonl(tmp_path: Path) -> None:
    trace = generate(WorkloadConfig(adapters=50, rate=5.0, duration_s=60.0, seed=3))
    path = tmp_path / "trace.jsonl"
    save(trace, path)
    assert load(path) == trace
