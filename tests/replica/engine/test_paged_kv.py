"""The paged KV cache on the production path (AdapterCache and GpuTier, real PEFT adapters): a prefix hit and
a chunked prompt give the logits a full prefill gives, blocks are shared only within one adapter version
and cache salt, and every block is free or cached, unheld, once the requests end."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from replica.engine import engine as engine_module
from replica.engine.engine import KvPolicy
from replica.engine.sampler import PendingSample, SamplingParams
from tests.replica.engine.engine_util import Served, greedy, make_engine
from tests.replica.peft_util import AdapterRecipe, make_peft_adapters

CAPACITIES = {8: 1, 16: 1}
PROMPT = [(7 * i) % 300 + 3 for i in range(70)]  # four full blocks of 16, and 6 tokens


@pytest.fixture(scope="module")
def adapters(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two adapters of different ranks (so they sit in different slot pools)."""
    recipes = [AdapterRecipe("ad1", 8, 16, seed=1), AdapterRecipe("ad2", 16, 32, seed=2)]
    _, dirs = make_peft_adapters(tiny_model_dir, tmp_path_factory.mktemp("paged"), recipes, std=0.3)
    return dirs


class LogitSpy:
    """The logits each request's tokens were sampled from, in order (engine.launch_sample wrapped)."""

    def __init__(self) -> None:
        self.by_params: dict[int, list[torch.Tensor]] = {}
        self.alive: list[SamplingParams] = []  # so that no id is reused by a later request's params

    def wrap(self, real: object) -> object:
        def sample(
            logits: torch.Tensor, params: list[SamplingParams], seeds: list[int], outputs: list[list[int]]
        ) -> PendingSample:
            for row, p in zip(logits, params, strict=True):
                self.by_params.setdefault(id(p), []).append(row.clone())
                self.alive.append(p)
            return real(logits, params, seeds, outputs)  # type: ignore[operator]

        return sample


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> Iterator[LogitSpy]:
    s = LogitSpy()
    monkeypatch.setattr(engine_module, "launch_sample", s.wrap(engine_module.launch_sample))
    yield s


async def _run(served: Served, rid: str, adapter: str | None, salt: str | None = None, n: int = 6) -> tuple:
    params = greedy(n)
    lease = await served.cache.acquire(adapter) if adapter is not None else None
    seq = served.engine.add_request(rid, PROMPT, params, adapter, cache_salt=salt)
    if lease is not None:
        served.leases[rid] = lease
    outs = served.run_all()[rid]
    return params, seq, outs


def _all_unheld(served: Served) -> None:
    blocks = served.engine.blocks
    blocks.check()
    assert blocks.num_free == blocks.num_blocks and all(b.ref_count == 0 for b in blocks.blocks)
    assert not blocks.tables


@pytest.mark.parametrize("adapter", ["ad1", "ad2", None])
async def test_a_prefix_hit_gives_the_logits_of_a_full_prefill(
    tiny_model_dir: Path, adapters: dict[str, Path], tmp_path: Path, spy: LogitSpy, adapter: str | None
) -> None:
    cold = make_engine(
        tiny_model_dir, adapters, CAPACITIES, tmp_path / "a", kv=KvPolicy(prefix_caching=False)
    )
    warm = make_engine(tiny_model_dir, adapters, CAPACITIES, tmp_path / "b")
    want, _, _ = await _run(cold, "probe", adapter)
    await _run(warm, "first", adapter)
    got, seq, outs = await _run(warm, "probe", adapter)
    assert seq.cached_tokens == 64 and outs[-1].cached_tokens == 64
    for a, b in zip(spy.by_params[id(want)], spy.by_params[id(got)], strict=True):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
    _all_unheld(warm)
    assert warm.engine.blocks.cached  # the blocks stay cached after the requests end


async def test_a_chunked_prompt_gives_the_logits_of_a_whole_one(
    tiny_model_dir: Path, adapters: dict[str, Path], tmp_path: Path, spy: LogitSpy
) -> None:
    whole = make_engine(
        tiny_model_dir,
        adapters,
        CAPACITIES,
        tmp_path / "a",
        kv=KvPolicy(prefix_caching=False, chunked_prefill=False),
    )
    chunked = make_engine(
        tiny_model_dir,
        adapters,
        CAPACITIES,
        tmp_path / "b",
        max_num_seqs=4,
        max_num_batched_tokens=9,  # 70 tokens in chunks of 9, not aligned to blocks
        kv=KvPolicy(prefix_caching=False),
    )
    want, _, _ = await _run(whole, "r", "ad1")
    got, _, outs = await _run(chunked, "r", "ad1")
    assert len(spy.by_params[id(got)]) == 6 and outs[-1].cached_tokens == 0
    for a, b in zip(spy.by_params[id(want)], spy.by_params[id(got)], strict=True):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
    _all_unheld(chunked)


async def test_blocks_are_shared_only_within_one_adapter_version_and_salt(
    tiny_model_dir: Path, adapters: dict[str, Path], tmp_path: Path, spy: LogitSpy
) -> None:
    served = make_engine(tiny_model_dir, adapters, CAPACITIES, tmp_path / "a")
    fresh = make_engine(
        tiny_model_dir, adapters, CAPACITIES, tmp_path / "b", kv=KvPolicy(prefix_caching=False)
    )
    await _run(served, "ad1-first", "ad1")
    other, seq, _ = await _run(served, "ad2-after-ad1", "ad2")
    assert seq.cached_tokens == 0  # the same tokens under another adapter: nothing shared
    alone, _, _ = await _run(fresh, "ad2-alone", "ad2")
    for a, b in zip(spy.by_params[id(alone)], spy.by_params[id(other)], strict=True):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
    _, base, _ = await _run(served, "base", None)
    assert base.cached_tokens == 0
    _, salted, _ = await _run(served, "salted", "ad1", salt="tenant-a")
    assert salted.cached_tokens == 0  # a salt never meets an unsalted block
    _, other_salt, _ = await _run(served, "other-salt", "ad1", salt="tenant-b")
    assert other_salt.cached_tokens == 0
    _, same_salt, _ = await _run(served, "same-salt", "ad1", salt="tenant-a")
    assert same_salt.cached_tokens == 64
    _all_unheld(served)


async def test_preempted_requests_finish_with_the_tokens_they_give_alone(
    tiny_model_dir: Path, adapters: dict[str, Path], tmp_path: Path
) -> None:
    roomy = make_engine(
        tiny_model_dir, adapters, CAPACITIES, tmp_path / "a", kv=KvPolicy(prefix_caching=False)
    )
    # 14 blocks: two 70-token prompts (5 blocks each) fit, but both cannot grow to 118 tokens (8 each)
    tight = make_engine(tiny_model_dir, adapters, CAPACITIES, tmp_path / "b", max_num_seqs=4, num_blocks=14)
    want = {}
    for rid, adapter in (("x", "ad1"), ("y", "ad2")):
        want[rid] = [o.token_id for o in (await _run(roomy, rid, adapter, n=48))[2] if o.token_id is not None]
    for rid, adapter in (("x", "ad1"), ("y", "ad2")):
        served_lease = await tight.cache.acquire(adapter)
        tight.engine.add_request(rid, PROMPT, greedy(48), adapter)
        tight.leases[rid] = served_lease
    outs = tight.run_all()
    assert tight.engine.scheduler.counters.preemptions >= 1
    for rid in want:
        assert [o.token_id for o in outs[rid] if o.token_id is not None] == want[rid]
    _all_unheld(tight)
