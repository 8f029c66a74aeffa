"""Temperature-0 tokens, and a seeded request's sampled tokens, are identical alone and in a batch with other
adapters (mixed ranks, base rows, mixed sampling parameters).

The adapters reach their slots through the adapter cache, and each request holds its lease as on a replica.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from replica.engine.sampler import SamplingParams
from tests.replica.engine.engine_util import greedy, make_engine, tokens
from tests.replica.peft_util import AdapterRecipe, make_peft_adapters

RANKS = [8, 16, 32]


@pytest.fixture(scope="module")
def many_adapters(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    recipes = [AdapterRecipe(f"ad{i}", RANKS[i % 3], 2 * RANKS[i % 3], seed=100 + i) for i in range(32)]
    _, dirs = make_peft_adapters(tiny_model_dir, tmp_path_factory.mktemp("many"), recipes, std=0.3)
    return dirs


async def test_tokens_identical_alone_and_in_mixed_batch(
    tiny_model_dir: Path, many_adapters: dict[str, Path], tmp_path: Path
) -> None:
    served = make_engine(tiny_model_dir, many_adapters, {8: 11, 16: 11, 32: 11}, tmp_path, max_num_seqs=40)
    gen = torch.Generator().manual_seed(11)
    requests: dict[str, tuple[list[int], str | None]] = {}
    for i in range(32):
        requests[f"r{i}"] = (torch.randint(1, 320, (5 + i % 7,), generator=gen).tolist(), f"ad{i}")
    for i in range(4):
        requests[f"base{i}"] = (torch.randint(1, 320, (6 + i,), generator=gen).tolist(), None)

    alone: dict[str, list[int]] = {}
    for rid, (prompt, adapter) in requests.items():
        await served.add(rid, prompt, greedy(12), adapter)
        alone[rid] = tokens(served.run_all()[rid])

    for rid, (prompt, adapter) in requests.items():
        await served.add(rid, prompt, greedy(12), adapter)
    assert len(served.engine.scheduler.waiting) == len(requests)  # all of them run in one batch from here
    together = {rid: tokens(outs) for rid, outs in served.run_all().items()}

    assert together == alone
    # the adapters matter: most adapted rows differ from the same prompt on the base model
    for i in range(32):
        await served.add(f"probe{i}", requests[f"r{i}"][0], greedy(12), None)
    on_base = {rid: tokens(outs) for rid, outs in served.run_all().items()}
    assert sum(on_base[f"probe{i}"] != alone[f"r{i}"] for i in range(32)) >= 24
    gpu = served.cache.gpu
    assert len(gpu.table) == 32 and all(e.ref_count == 0 for e in gpu.table.entries())  # every pin released


async def test_tokens_identical_alone_and_in_a_chunked_batch_that_hits_the_prefix_cache(
    tiny_model_dir: Path, many_adapters: dict[str, Path], tmp_path: Path
) -> None:
    # a step computes at most 48 tokens: the 32 prompts of 20-50 tokens arrive over many steps, in chunks
    served = make_engine(
        tiny_model_dir,
        many_adapters,
        {8: 11, 16: 11, 32: 11},
        tmp_path,
        max_num_seqs=40,
        max_num_batched_tokens=48,
    )
    gen = torch.Generator().manual_seed(12)
    system = torch.randint(1, 320, (18,), generator=gen).tolist()  # one system prompt, over a block
    requests: dict[str, tuple[list[int], str | None]] = {}
    for i in range(32):
        tail = torch.randint(1, 320, (2 + i % 30,), generator=gen).tolist()
        requests[f"r{i}"] = (system + tail, f"ad{i}")
    for i in range(4):
        requests[f"base{i}"] = (system + torch.randint(1, 320, (6 + i,), generator=gen).tolist(), None)

    alone: dict[str, list[int]] = {}
    for rid, (prompt, adapter) in requests.items():
        await served.add(rid, prompt, greedy(12), adapter)
        alone[rid] = tokens(served.run_all()[rid])
    hits = served.engine.scheduler.counters.hits
    for rid, (prompt, adapter) in requests.items():
        await served.add(rid, prompt, greedy(12), adapter)
    outs = served.run_all()
    assert {rid: tokens(o) for rid, o in outs.items()} == alone
    assert served.engine.scheduler.counters.hits > hits  # each adapter's own earlier run was hit
    assert all(o[-1].cached_tokens >= 16 for o in outs.values())
    blocks = served.engine.blocks
    blocks.check()
    assert blocks.num_free == blocks.num_blocks and all(b.ref_count == 0 for b in blocks.blocks)


def _sampled(max_tokens: int = 12, **kw: object) -> SamplingParams:
    return SamplingParams(**{"temperature": 1.0, "max_tokens": max_tokens, "ignore_eos": True, **kw})


async def test_a_seeded_sampled_request_gives_the_same_tokens_alone_first_or_last_among_others(
    tiny_model_dir: Path, many_adapters: dict[str, Path], tmp_path: Path
) -> None:
    served = make_engine(tiny_model_dir, many_adapters, {8: 11, 16: 11, 32: 11}, tmp_path, max_num_seqs=40)
    gen = torch.Generator().manual_seed(13)
    prompt = torch.randint(1, 320, (9,), generator=gen).tolist()
    others = [
        (greedy(12), "ad1"),
        (_sampled(top_p=0.8), "ad2"),
        (_sampled(top_k=5, seed=7), None),
        (_sampled(presence_penalty=1.5, frequency_penalty=0.5), "ad4"),
        (greedy(12, frequency_penalty=1.0), "ad5"),
        (_sampled(temperature=1.7, logit_bias=((3, 4.0),)), None),
    ]
    other_prompts = [torch.randint(1, 320, (4 + i,), generator=gen).tolist() for i in range(len(others))]

    async def run(seed: int, place: str) -> list[int]:
        if place == "last":
            for i, ((params, adapter), p) in enumerate(zip(others, other_prompts, strict=True)):
                await served.add(f"o{i}", p, params, adapter)
        await served.add("seeded", prompt, _sampled(seed=seed), "ad3")
        if place == "first":
            for i, ((params, adapter), p) in enumerate(zip(others, other_prompts, strict=True)):
                await served.add(f"o{i}", p, params, adapter)
        return tokens(served.run_all()["seeded"])

    alone = await run(2024, "alone")
    assert await run(2024, "first") == alone
    assert await run(2024, "last") == alone
    assert await run(2025, "alone") != alone
    assert len(set(alone)) > 3  # sampled, not a greedy run in disguise
