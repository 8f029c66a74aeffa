"""A request's n choices: the prompt is prefilled once and found in the prefix cache by the other choices,
each choice draws with its own seed, reproducibly, and closing the stream aborts them all."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from replica.choices import ChoiceRequest, choice_outputs
from replica.engine.async_engine import AsyncEngine
from replica.engine.engine import LLMEngine, StepOutput
from replica.engine.model_runner import ModelRunner
from replica.engine.sampler import SamplingParams
from replica.model.loader import load_model
from tests.replica.engine.engine_util import EOS, CharDetokenizer

PROMPT = list(range(1, 41))  # two full blocks of 16 and a partial one


def _engine(tiny_model_dir: Path) -> AsyncEngine:
    runner = ModelRunner(load_model(tiny_model_dir, "float32", "cpu"), max_num_seqs=4, max_model_len=96)
    return AsyncEngine(LLMEngine(runner, None, {EOS}, detokenizer_factory=CharDetokenizer))


def _request(n: int, seed: int | None = 7, request_id: str = "r") -> ChoiceRequest:
    params = SamplingParams(temperature=1.5, seed=seed, max_tokens=6, ignore_eos=True)
    return ChoiceRequest(PROMPT, params, n, None, request_id, None, None, None)


async def _run(engine: AsyncEngine, req: ChoiceRequest) -> dict[int, list[StepOutput]]:
    outs: dict[int, list[StepOutput]] = {}
    async for index, out in choice_outputs(engine, req):
        outs.setdefault(index, []).append(out)
    return outs


async def test_later_choices_find_the_prompt_in_the_prefix_cache_and_each_draws_its_own(
    tiny_model_dir: Path,
) -> None:
    engine = _engine(tiny_model_dir)
    engine.start()
    try:
        first = await _run(engine, _request(3, request_id="a"))
        again = await _run(engine, _request(3, request_id="b"))
    finally:
        engine.stop()
    assert sorted(first) == [0, 1, 2]
    for outs in first.values():
        assert [o.finished for o in outs] == [False] * 5 + [True] and outs[-1].completion_tokens == 6
    block = engine.engine.runner.block_size
    assert first[0][-1].cached_tokens == 0
    assert first[1][-1].cached_tokens == first[2][-1].cached_tokens == (len(PROMPT) // block) * block
    tokens = {i: [o.token_id for o in outs] for i, outs in first.items()}
    assert len({tuple(t) for t in tokens.values()}) == 3  # distinct seeds, distinct draws
    assert tokens == {i: [o.token_id for o in outs] for i, outs in again.items()}  # and reproducible


async def test_closing_the_stream_aborts_every_choice(tiny_model_dir: Path) -> None:
    engine = _engine(tiny_model_dir)
    engine.start()
    try:
        gen = choice_outputs(engine, _request(3, seed=None))
        async with contextlib.aclosing(gen):
            seen = {index async for index, _ in _until_all_started(gen)}
        assert seen == {0, 1, 2}
        for _ in range(100):
            if engine.engine.is_idle():
                break
            await asyncio.sleep(0.02)
        assert engine.engine.is_idle() and not engine.engine.seqs
    finally:
        engine.stop()


async def _until_all_started(
    gen: AsyncIterator[tuple[int, StepOutput]],
) -> AsyncIterator[tuple[int, StepOutput]]:
    """gen's outputs until every choice has produced one."""
    seen: set[int] = set()
    async for index, out in gen:
        seen.add(index)
        yield index, out
        if seen == {0, 1, 2}:
            return
