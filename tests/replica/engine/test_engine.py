"""Engine behaviour: continuous batching, cancellation, stop strings, max_tokens, seeds, eviction safety.

Adapters reach their slots through the adapter cache and each adapted request holds a lease from its add to
its end, as on a replica (tests.replica.engine.engine_util.Served).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from replica.adapter_cache.errors import AdapterNotRegisteredError
from replica.engine.sampler import SamplingParams
from replica.errors import ContextLengthError, InvalidRequestError, NoFreeSlotError
from tests.replica.cache_util import own_in_slots
from tests.replica.engine.engine_util import Served, greedy, make_engine, tokens
from tests.replica.peft_util import AdapterRecipe, make_peft_adapters

PROMPT = [5, 17, 42, 99, 7, 3]


@pytest.fixture(scope="module")
def adapters(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    recipes = [
        AdapterRecipe("ad1", 8, 16, seed=1),
        AdapterRecipe("ad2", 8, 16, seed=2),
        AdapterRecipe("ad3", 16, 16, seed=3),
    ]
    _, dirs = make_peft_adapters(tiny_model_dir, tmp_path_factory.mktemp("eng"), recipes, std=0.3)
    return dirs


async def _solo(
    served: Served, prompt: list[int], params: SamplingParams, adapter: str | None = None
) -> list[int]:
    await served.add("solo", prompt, params, adapter)
    return tokens(served.run_all()["solo"])


async def test_request_joins_running_batch_at_next_step(
    tiny_model_dir: Path, adapters: dict[str, Path], tmp_path: Path
) -> None:
    served = make_engine(tiny_model_dir, adapters, {8: 2, 16: 1}, tmp_path)
    solo_a = await _solo(served, PROMPT, greedy(12), "ad1")
    solo_b = await _solo(served, PROMPT[:4], greedy(6), "ad3")
    await served.add("x", PROMPT, greedy(12), "ad1")
    outs: dict[str, list] = {"x": [], "y": []}
    for _ in range(3):
        for o in served.step():
            outs[o.request_id].append(o)
    await served.add("y", PROMPT[:4], greedy(6), "ad3")
    step = served.step()
    assert {o.request_id for o in step} == {"x", "y"}  # y prefills in the same step as x decodes
    for o in step:
        outs[o.request_id].append(o)
    for rid, o in served.run_all().items():
        outs[rid] += o
    assert tokens(outs["x"]) == solo_a and tokens(outs["y"]) == solo_b


async def test_cancel_frees_blocks_and_adapter_pin(
    tiny_model_dir: Path, adapters: dict[str, Path], tmp_path: Path
) -> None:
    served = make_engine(tiny_model_dir, adapters, {8: 1, 16: 1}, tmp_path, max_num_seqs=2)
    engine, gpu = served.engine, served.cache.gpu
    await served.add("x", PROMPT, greedy(50), "ad1")
    engine.step()
    assert engine.blocks.table("x") and gpu.ref_count("ad1") == 2  # the request's lease, its row's pin
    assert engine.abort("x")
    assert engine.blocks.num_free == engine.blocks.num_blocks and gpu.ref_count("ad1") == 1  # freed at once
    assert not engine.has_work()
    served.release("x")
    await served.cache.own("ad2", "gpu")  # a is idle now, so its only rank-8 slot may be taken
    assert served.cache.tier_of("ad1") == "ram" and served.cache.tier_of("ad2") == "gpu"


async def test_max_tokens_ends_with_length(
    tiny_model_dir: Path, adapters: dict[str, Path], tmp_path: Path
) -> None:
    served = make_engine(tiny_model_dir, adapters, {8: 1}, tmp_path)
    await served.add("x", PROMPT, greedy(7))
    outs = served.run_all()["x"]
    assert len(tokens(outs)) == 7 and outs[-1].finished and outs[-1].finish_reason == "length"
    assert outs[-1].completion_tokens == 7 and outs[-1].prompt_tokens == len(PROMPT)


async def test_stop_string_ends_generation_and_is_not_emitted(
    tiny_model_dir: Path, adapters: dict[str, Path], tmp_path: Path
) -> None:
    served = make_engine(tiny_model_dir, adapters, {8: 1}, tmp_path)
    await served.add("full", PROMPT, greedy(20))
    full = "".join(o.text for o in served.run_all()["full"])
    stop = full[6:9]
    await served.add("x", PROMPT, greedy(20, stop=(stop,)))
    outs = served.run_all()["x"]
    text = "".join(o.text for o in outs)
    assert text == full[: full.index(stop)] and outs[-1].finish_reason == "stop"
    assert len(tokens(outs)) < 20


async def test_eos_stops_unless_ignored(
    tiny_model_dir: Path, adapters: dict[str, Path], tmp_path: Path
) -> None:
    served = make_engine(tiny_model_dir, adapters, {8: 1}, tmp_path)
    first = await _solo(served, PROMPT, greedy(5))
    served.engine.eos_token_ids = {first[2]}
    await served.add("x", PROMPT, SamplingParams(temperature=0.0, max_tokens=5))
    outs = served.run_all()["x"]
    assert tokens(outs) == first[: first.index(first[2]) + 1] and outs[-1].finish_reason == "stop"


async def test_seed_makes_sampling_reproducible(
    tiny_model_dir: Path, adapters: dict[str, Path], tmp_path: Path
) -> None:
    served = make_engine(tiny_model_dir, adapters, {8: 2}, tmp_path)
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=1234, max_tokens=16, ignore_eos=True)
    one = await _solo(served, PROMPT, params, "ad1")
    await served.add(
        "other", PROMPT[:3], SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True), "ad2"
    )
    await served.add("solo", PROMPT, params, "ad1")
    two = tokens(served.run_all()["solo"])
    other_seed = await _solo(
        served, PROMPT, SamplingParams(temperature=1.0, seed=99, max_tokens=16, ignore_eos=True), "ad1"
    )
    assert one == two and one != other_seed


async def test_penalties_count_the_generated_tokens_not_the_prompt(
    tiny_model_dir: Path, adapters: dict[str, Path], tmp_path: Path
) -> None:
    served = make_engine(tiny_model_dir, adapters, {8: 1}, tmp_path)
    prompt = [11, 12, 13]
    plain = await _solo(served, prompt, greedy(12))
    assert plain[0] in prompt and len(set(plain)) < 6  # greedy repeats a prompt token, then its own
    penalised = await _solo(served, prompt, greedy(12, presence_penalty=2.0))
    assert penalised[0] == plain[0] and len(set(penalised)) == 12


async def test_evicted_then_reloaded_adapter_gives_identical_tokens(
    tiny_model_dir: Path, adapters: dict[str, Path], tmp_path: Path
) -> None:
    served = make_engine(tiny_model_dir, adapters, {8: 1, 16: 1}, tmp_path)
    before = await _solo(served, PROMPT, greedy(10), "ad1")
    await _solo(served, PROMPT, greedy(3), "ad2")  # b takes the only rank-8 slot: a is evicted
    assert served.cache.tier_of("ad1") == "ram" and served.cache.gpu_evictions.total == 1
    assert await _solo(served, PROMPT, greedy(10), "ad1") == before
    assert served.cache.gpu_evictions.total == 2 and served.cache.tier_of("ad2") == "ram"


async def test_running_adapter_is_never_evicted(
    tiny_model_dir: Path, adapters: dict[str, Path], tmp_path: Path
) -> None:
    served = make_engine(tiny_model_dir, adapters, {8: 1, 16: 1}, tmp_path)
    solo_a = await _solo(served, PROMPT, greedy(10), "ad1")
    await served.add("x", PROMPT, greedy(10), "ad1")
    y = asyncio.create_task(served.add("y", PROMPT, greedy(4), "ad2"))  # needs a's slot: waits until x ends
    outs: dict[str, list] = {"x": [], "y": []}
    for o in served.step():
        outs[o.request_id].append(o)
    await asyncio.sleep(0.1)  # y's acquire keeps asking for a slot meanwhile
    assert not y.done() and "y" not in served.engine.seqs
    with pytest.raises(NoFreeSlotError):
        await served.cache.ensure(
            "ad2", "gpu"
        )  # an explicit load cannot take a running adapter's slot either
    assert served.cache.tier_of("ad1") == "gpu"
    while "x" in served.engine.seqs:
        for o in served.step():
            outs[o.request_id].append(o)
    await y  # x ended and released a's slot: y's adapter takes it
    for rid, o in served.run_all().items():
        outs[rid] += o
    assert tokens(outs["x"]) == solo_a and len(tokens(outs["y"])) == 4
    assert served.cache.tier_of("ad1") == "ram"


async def test_bad_requests_are_refused(
    tiny_model_dir: Path, adapters: dict[str, Path], tmp_path: Path
) -> None:
    served = make_engine(tiny_model_dir, adapters, {8: 1}, tmp_path)
    engine = served.engine
    with pytest.raises(ContextLengthError):
        engine.add_request("x", [1] * 200, greedy(3))
    with pytest.raises(InvalidRequestError):
        engine.add_request("x", [], greedy(3))
    with pytest.raises(InvalidRequestError):
        engine.add_request("x", PROMPT, SamplingParams(top_p=0.0))
    with pytest.raises(InvalidRequestError) as bias:
        engine.add_request("x", PROMPT, greedy(3, logit_bias=((320, 1.0),)))  # the tiny vocab is 320
    assert bias.value.param == "logit_bias"
    with pytest.raises(AdapterNotRegisteredError):
        await served.add("x", PROMPT, greedy(3), "not-registered")
    assert not engine.has_work()


async def test_a_request_whose_adapter_is_in_no_slot_fails_alone(
    tiny_model_dir: Path, adapters: dict[str, Path], tmp_path: Path
) -> None:
    served = make_engine(tiny_model_dir, adapters, {8: 1}, tmp_path)
    served.engine.add_request("x", PROMPT, greedy(3), "ad1")  # queued without the cache bringing it in
    await served.add("y", PROMPT, greedy(3))
    outs = served.run_all()
    assert outs["x"][-1].finished and outs["x"][-1].finish_reason == "error" and "ad1" in outs["x"][-1].error
    blocks = served.engine.blocks
    assert len(tokens(outs["y"])) == 3 and blocks.num_free == blocks.num_blocks and not blocks.tables


async def test_step_refuses_a_row_whose_slot_holds_another_adapter(
    tiny_model_dir: Path, adapters: dict[str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    served = make_engine(tiny_model_dir, adapters, {8: 2}, tmp_path)
    await own_in_slots(served.cache, ["ad2"])
    await served.add("x", PROMPT, greedy(5), "ad1")
    with caplog.at_level(logging.INFO, logger="replica.engine"):
        served.step()
    assert any("request x adapter=ad1" in r.getMessage() for r in caplog.records)  # logged at admission
    table = served.cache.gpu.table
    ref = table.lookup("ad1").ref
    table._by_slot[ref] = "ad2"  # simulate a slot-table bug: the slot now claims another adapter
    await served.add("y", PROMPT, greedy(2))  # a base row in the same batch is unaffected
    outs = served.step()
    (refused,) = [o for o in outs if o.request_id == "x"]
    assert refused.finished and refused.token_id is None and refused.error.startswith("slot_mismatch")
    assert [o.request_id for o in outs if o.request_id == "y"] == ["y"]
    assert "x" not in served.engine.seqs and "x" not in served.leases
