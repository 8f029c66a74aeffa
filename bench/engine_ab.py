"""`lorafleet bench engine-ab`: our engine's decode tokens/s at two commits, side by side.

Each commit is checked out into a worktree of its own; each round runs one process per side, the sides
alternating, so a noisy neighbour slows both alike. A process imports only its own tree (the editable
install's path hook is taken out first) and times its own `bench.engine` build_engine and run_engine with
0, 1, 8 and 32 distinct adapters; the result is each side's median per adapter count, and after / before.
"""

from __future__ import annotations

import json
import logging
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bench._util import environment

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]

# Run in a fresh interpreter with the tree as argv[1]: nothing of the caller's tree is imported first.
OWN_TREE = """
import sys
tree = sys.argv[1]
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__.lower()]
sys.path.insert(0, tree)
import bench.engine as be
assert be.__file__.startswith(tree), be.__file__
"""
CHILD = (
    OWN_TREE
    + """
import json, tempfile
from pathlib import Path
import torch
new_tokens, reps, distinct = int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
from lorafleet.model.base_hash import base_model_hash
from lorafleet.model.prepare import ensure_default_model
from replica.model.tokenizer import Tokenizer
cfg = be.EngineBenchConfig(new_tokens=new_tokens, rounds=1)
model_dir = ensure_default_model(None)
base_hash = base_model_hash(model_dir)
tokenizer = Tokenizer.from_dir(model_dir)
prompts = be.chat_prompts(tokenizer, cfg.batch)
top = max(max(distinct), 1)
with tempfile.TemporaryDirectory() as tmp:
    hf = be.load_hf_model(model_dir, cfg.dtype, torch.device(cfg.device))
    be.make_peft_adapters(hf, Path(tmp), top, cfg.rank, base_hash)
    adapters = {f"a{i}": be.adapter_dir(Path(tmp), f"a{i}") for i in range(top)}
    longest = max(len(p) for p in prompts)
    engine = be.build_engine(model_dir, adapters, cfg, tokenizer, base_hash, longest, Path(tmp) / "cache")
def ids(d):
    return [None if d == 0 else f"a{i % d}" for i in range(cfg.batch)]
for d in distinct:
    be.run_engine(engine, prompts[:2], ids(d)[:2], 2)
out = {}
for _ in range(reps):
    for d in distinct:
        run = be.run_engine(engine, prompts, ids(d), cfg.new_tokens)
        out.setdefault(str(d), []).append(run.decode_tokens_per_s)
print("RESULT " + json.dumps(out))
"""
)


def worktree(rev: str, where: Path) -> Path:
    """A detached worktree of rev under where. git's own messages stay off stdout, which carries the bench's
    JSON."""
    path = where / rev.replace("/", "_")
    done = subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", str(path), rev],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"git worktree add {rev} failed: {done.stderr.strip()}")
    return path


def run_side(tree: Path, new_tokens: int, reps: int, distinct: tuple[int, ...]) -> dict[str, list[float]]:
    """One process timing tree's engine: tokens/s per adapter count, `reps` samples each."""
    argv = [sys.executable, "-c", CHILD, str(tree), str(new_tokens), str(reps), json.dumps(list(distinct))]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{tree}: exited {done.returncode}\n{done.stderr[-2000:]}")
    samples: dict[str, list[float]] = json.loads(lines[-1].removeprefix("RESULT "))
    return samples


def alternate(
    before: str, after: str | None, rounds: int, measure: Callable[[Path], dict[str, list[float]]]
) -> dict[str, dict[str, list[float]]]:
    """Samples per side and key from measure(tree), each side in its own worktree (after None: this working
    tree), the sides alternating over rounds so that a noisy neighbour slows both alike."""
    samples: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}
    with tempfile.TemporaryDirectory(prefix="ab-") as tmp:
        trees = {
            "before": worktree(before, Path(tmp)),
            "after": worktree(after, Path(tmp)) if after else REPO,
        }
        try:
            for r in range(rounds):
                for side, tree in trees.items():
                    for key, values in measure(tree).items():
                        samples[side].setdefault(key, []).extend(values)
                    log.info("round %d %s done", r, side)
        finally:
            for tree in trees.values():
                if tree != REPO:
                    subprocess.run(
                        ["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], check=False
                    )
    return samples


def side_label(after: str | None) -> str:
    """What an after side ran: the commit given, or the working tree's commit (and whether it had changes)."""
    if after:
        return after
    git = ["git", "-C", str(REPO)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False)
    changed = subprocess.run(
        [*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, check=False
    )
    dirty = " with uncommitted changes" if changed.stdout.strip() else ""
    return f"working tree at {head.stdout.strip() or 'unknown'}{dirty}"


def engine_ab(
    before: str, after: str | None, rounds: int = 3, reps: int = 2, new_tokens: int = 16
) -> dict[str, Any]:
    """Decode tokens/s of the engine at before and at after (None: this working tree), alternating."""
    distinct = (0, 1, 8, 32)
    samples = alternate(before, after, rounds, lambda tree: run_side(tree, new_tokens, reps, distinct))
    medians = {side: {d: round(statistics.median(v), 1) for d, v in s.items()} for side, s in samples.items()}
    return {
        "benchmark": "engine-ab",
        "before": before,
        "after": side_label(after),
        "rounds": rounds,
        "samples_per_side": rounds * reps,
        "decode_tokens_per_s_median": medians,
        "after_over_before": {
            d: round(medians["after"][d] / medians["before"][d], 3) for d in medians["after"]
        },
        "samples": samples,
        "environment": environment(torch.device("cpu"), "float32"),
    }
