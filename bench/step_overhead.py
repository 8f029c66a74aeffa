"""`lorafleet bench step-overhead`: the host's share of a decode step, at two commits side by side.

On a tiny base (the canary's: 2 layers, hidden 64) the arithmetic of a step is negligible, so its time is
what the host spends around it: Python, tensor building and one CPU dispatch per operator, the same work
that launches kernels on a GPU. Each side runs in its own process from its own worktree (as engine-ab
does), the sides alternating over rounds, and times ModelRunner.run on a batch of decoding rows with 0 and
with as many distinct rank-16 adapters as rows. The result is each side's median step, its operators per
step, and after / before.
"""

from __future__ import annotations

import json
import logging
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from bench._util import environment
from bench.engine_ab import OWN_TREE, alternate, side_label

log = logging.getLogger(__name__)

# Only APIs both sides share: the tiny base, load_model, apply_lora, ModelRunner and its StepInput.
CHILD = (
    OWN_TREE
    + """
import json, statistics, tempfile, time
from pathlib import Path
import torch
batch, iters, prompt, max_len = (int(a) for a in sys.argv[2:6])
from canary.tiny_base import write_tiny_base
from replica.engine.model_runner import ModelRunner, StepInput
from replica.lora.replace import apply_lora
from replica.lora.slots import SlotRef
from replica.model.loader import load_model
torch.manual_seed(0)
torch.set_num_threads(1)
with tempfile.TemporaryDirectory() as tmp:
    model = load_model(write_tiny_base(Path(tmp) / "base"), "float32", "cpu")
wrappers = apply_lora(model, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                      {16: batch})
with torch.no_grad():
    for w in wrappers.values():
        pool = w.pools[16]
        pool.a.normal_(0.0, 0.1); pool.b.normal_(0.0, 0.1); pool.scale.fill_(2.0)
runner = ModelRunner(model, max_num_seqs=batch, max_model_len=max_len)
runner.run([StepInput([5] * prompt, 0, runner.row_table(i)) for i in range(batch)])
out = {}
for distinct in (0, batch):
    steps = [StepInput([7], prompt, runner.row_table(i), SlotRef(16, i % distinct) if distinct else None)
             for i in range(batch)]
    for _ in range(5):
        runner.run(steps)
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        runner.run(steps)
        times.append(time.perf_counter() - start)
    out[str(distinct)] = statistics.median(times)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        runner.run(steps)
    out[f"operators:{distinct}"] = sum(e.count for e in prof.key_averages() if e.key.startswith("aten::"))
print("RESULT " + json.dumps(out))
"""
)


def run_side(
    tree: Path, batch: int, iters: int, context: int = 8, max_model_len: int = 64
) -> dict[str, float]:
    """One process timing tree's decode step: median seconds per step, by distinct adapters, and
    ("operators:<distinct>") the aten calls of one step."""
    argv = [sys.executable, "-c", CHILD, str(tree), str(batch), str(iters), str(context), str(max_model_len)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{tree}: exited {done.returncode}\n{done.stderr[-2000:]}")
    result: dict[str, float] = json.loads(lines[-1].removeprefix("RESULT "))
    return result


def step_overhead(
    before: str,
    after: str | None = None,
    rounds: int = 3,
    batch: int = 32,
    iters: int = 200,
    context: int = 8,
    max_model_len: int = 64,
) -> dict[str, Any]:
    """Median decode-step seconds on the tiny base at before and at after (None: this working tree)."""
    samples = alternate(
        before,
        after,
        rounds,
        lambda tree: {d: [t] for d, t in run_side(tree, batch, iters, context, max_model_len).items()},
    )
    operators = {
        side: {d.removeprefix("operators:"): int(v[0]) for d, v in s.items() if d.startswith("operators:")}
        for side, s in samples.items()
    }  # the same every round: torch's profiler counts one step's aten calls
    samples = {side: {d: v for d, v in s.items() if ":" not in d} for side, s in samples.items()}
    medians = {side: {d: statistics.median(v) for d, v in s.items()} for side, s in samples.items()}
    return {
        "benchmark": "step-overhead",
        "before": before,
        "after": side_label(after),
        "batch": batch,
        "context": context,  # tokens each row has cached before its timed steps
        "max_model_len": max_model_len,  # sets the block table's width
        "rounds": rounds,
        "step_us_median": {side: {d: round(v * 1e6, 1) for d, v in m.items()} for side, m in medians.items()},
        # each round's after / before, its two sides run back to back: steadier on a noisy host
        "paired_ratio_median": {
            d: round(
                statistics.median(
                    a / b for a, b in zip(samples["after"][d], samples["before"][d], strict=True)
                ),
                3,
            )
            for d in samples["after"]
        },
        "after_over_before": {
            d: round(medians["after"][d] / medians["before"][d], 3) for d in medians["after"]
        },
        "operators_per_step": operators,
        "samples_s": samples,
        "environment": environment(torch.device("cpu"), "float32"),
    }
