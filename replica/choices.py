"""A request's n choices on the engine: one sequence each, merged into one stream of (index, output).

Choice 0 is admitted first and the others once it has produced its first token: by then its prompt's full
KV blocks are in the prefix cache, so the other choices prefill only the prompt's last partial block.
Choice i > 0 samples with sampler.choice_seed(seed, i) when the request has a seed, its own random seed
otherwise. The stream ends after every choice's final output, or at the first failed one; closing it early
aborts every choice still running.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, replace

from replica.engine.async_engine import AsyncEngine
from replica.engine.engine import StepOutput
from replica.engine.grammar_mask import Grammar
from replica.engine.sampler import SamplingParams, choice_seed
from replica.engine.trace import AdmissionTrace


@dataclass(frozen=True)
class ChoiceRequest:
    """What every choice of one request shares."""

    prompt: list[int]
    params: SamplingParams
    n: int
    adapter_id: str | None
    request_id: str
    trace: AdmissionTrace | None  # stamped by choice 0 only
    tenant_id: str | None
    cache_salt: str | None
    grammar: Callable[[], Grammar] | None = None  # each choice's own structured-output state


def choice_params(params: SamplingParams, index: int) -> SamplingParams:
    """Choice index's sampling parameters: its own seed, derived from the request's."""
    return params if params.seed is None else replace(params, seed=choice_seed(params.seed, index))


def choice_request_id(request_id: str, index: int) -> str:
    """The engine's id for one choice (choice 0 keeps the request's, so a single choice is unchanged)."""
    return request_id if index == 0 else f"{request_id}/{index}"


async def choice_outputs(
    engine: AsyncEngine, req: ChoiceRequest
) -> AsyncGenerator[tuple[int, StepOutput], None]:
    """Every choice's outputs as they come, tagged with the choice's index (see the module doc)."""
    merged: asyncio.Queue[tuple[int, StepOutput]] = asyncio.Queue()

    async def run(index: int) -> None:
        gen = engine.generate(
            req.prompt,
            choice_params(req.params, index),
            req.adapter_id,
            choice_request_id(req.request_id, index),
            req.trace if index == 0 else None,
            req.tenant_id,
            req.cache_salt,
            req.grammar() if req.grammar is not None else None,
        )
        try:
            async with contextlib.aclosing(gen):
                async for out in gen:
                    merged.put_nowait((index, out))
        except Exception as exc:  # a failure ends the whole stream through its error output
            rid = choice_request_id(req.request_id, index)
            merged.put_nowait((index, StepOutput(rid, None, "", True, "error", len(req.prompt), 0, str(exc))))

    tasks = [asyncio.create_task(run(0))]
    open_choices = req.n
    try:
        while open_choices:
            index, out = await merged.get()
            if len(tasks) == 1 and req.n > 1 and out.error is None:
                tasks += [asyncio.create_task(run(i)) for i in range(1, req.n)]
            yield index, out
            if out.error is not None:
                return
            open_choices -= out.finished
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
