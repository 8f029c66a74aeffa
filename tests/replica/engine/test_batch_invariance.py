"""Temperature-0 tokens are identical alone and in a batch with 31 other adapters (mixed ranks, base rows)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.replica.engine.engine_util import greedy, make_engine, run_all, tokens
from tests.replica.peft_util import AdapterRecipe, make_peft_adapters

RANKS = [8, 16, 32]


@pytest.fixture(scope="module")
def many_adapters(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    recipes = [AdapterRecipe(f"ad{i}", RANKS[i % 3], 2 * RANKS[i % 3], seed=100 + i) for i in range(32)]
    _, dirs = make_peft_adapters(tiny_model_dir, tmp_path_factory.mktemp("many"), recipes, std=0.3)
    return dirs


def test_tokens_identical_alone_and_in_mixed_batch(
    tiny_model_dir: Path, many_adapters: dict[str, Path]
) -> None:
    engine, manager = make_engine(tiny_model_dir, many_adapters, {8: 11, 16: 11, 32: 11}, max_num_seqs=40)
    gen = torch.Generator().manual_seed(11)
    requests: dict[str, tuple[list[int], str | None]] = {}
    for i in range(32):
        requests[f"r{i}"] = (torch.randint(1, 320, (5 + i % 7,), generator=gen).tolist(), f"ad{i}")
    for i in range(4):
        requests[f"base{i}"] = (torch.randint(1, 320, (6 + i,), generator=gen).tolist(), None)

    alone: dict[str, list[int]] = {}
    for rid, (prompt, adapter) in requests.items():
        engine.add_request(rid, prompt, greedy(12), adapter)
        alone[rid] = tokens(run_all(engine)[rid])

    for rid, (prompt, adapter) in requests.items():
        engine.add_request(rid, prompt, greedy(12), adapter)
    together = {rid: tokens(outs) for rid, outs in run_all(engine).items()}

    assert together == alone
    # the adapters matter: most adapted rows differ from the same prompt on the base model
    for i in range(32):
        engine.add_request(f"probe{i}", requests[f"r{i}"][0], greedy(12), None)
    on_base = {rid: tokens(outs) for rid, outs in run_all(engine).items()}
    assert sum(on_base[f"probe{i}"] != alone[f"r{i}"] for i in range(32)) >= 24
    assert all(e.ref_count == 0 for e in manager.table.entries())
