"""Sampler cost per call on random logits: all greedy, all temperature 1.0, all top_p 0.9, and a mix with
penalties, bias and top-k. All greedy is the baseline each case's ratio is against (same run).

    python bench/sampling.py --device cuda --batch 64 --vocab 128256 --iters 50

Imports only torch, the standard library and the sampler, so a bare GPU check can call sampling_cost.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

if __package__ in (None, ""):  # run as a script: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from replica.engine.sampler import SamplingParams, sample  # noqa: E402

HISTORY = 64  # generated tokens per row in the mixed case, which the penalties count


def _mixed(batch: int) -> list[SamplingParams]:
    """A quarter each: greedy with frequency penalty, top-p with presence, top-k with bias, plain."""
    kinds = [
        SamplingParams(temperature=0.0, frequency_penalty=0.5),
        SamplingParams(temperature=0.8, top_p=0.9, presence_penalty=0.5),
        SamplingParams(temperature=1.0, top_k=50, logit_bias=((1, 5.0), (2, -100.0))),
        SamplingParams(temperature=1.0),
    ]
    return [kinds[i % len(kinds)] for i in range(batch)]


def sampling_cost(device: torch.device | str, batch: int, vocab: int, iters: int) -> dict[str, float]:
    """Microseconds per sample() call on random fp32 logits [batch, vocab], per case (median of iters)."""
    device = torch.device(device)
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(batch, vocab, generator=gen).to(device)  # [batch, vocab]
    history = torch.randint(0, vocab, (batch, HISTORY), generator=gen).tolist()  # [batch][HISTORY]
    cases = {
        "greedy": [SamplingParams(temperature=0.0)] * batch,
        "temperature_1": [SamplingParams(temperature=1.0)] * batch,
        "top_p_0.9": [SamplingParams(temperature=1.0, top_p=0.9)] * batch,
        "mixed_penalties": _mixed(batch),
    }
    seeds = list(range(batch))
    out: dict[str, float] = {}
    for name, params in cases.items():
        outputs = history if name == "mixed_penalties" else [[] for _ in range(batch)]
        sample(logits, params, seeds, outputs)  # warm-up: allocator, kernels
        times = []
        for _ in range(iters):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            sample(logits, params, seeds, outputs)  # ends in .tolist(): the ids are on the host
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - start)
        out[name] = sorted(times)[len(times) // 2] * 1e6
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description="Sampler cost per call, per case, in microseconds.")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--iters", type=int, default=50)
    args = parser.parse_args()
    cost = sampling_cost(args.device, args.batch, args.vocab, args.iters)
    report = {
        "device": args.device,
        "batch": args.batch,
        "vocab": args.vocab,
        "us_per_call": {k: round(v, 1) for k, v in cost.items()},
        "ratio_to_greedy": {k: round(v / cost["greedy"], 2) for k, v in cost.items()},
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
