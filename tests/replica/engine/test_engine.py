"""Engine behaviour: continuous batching, cancellation, stop strings, max_tokens, seeds, eviction safety."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from replica.engine.sampler import SamplingParams
from replica.errors import ContextLengthError, InvalidRequestError, NoFreeSlotError
from tests.replica.engine.engine_util import greedy, make_engine, run_all, tokens
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


def _solo(engine, prompt, params, adapter=None) -> list[int]:
    engine.add_request("solo", prompt, params, adapter)
    return tokens(run_all(engine)["solo"])


def test_request_joins_running_batch_at_next_step(tiny_model_dir: Path, adapters: dict[str, Path]) -> None:
    engine, _ = make_engine(tiny_model_dir, adapters, {8: 2, 16: 1})
    solo_a, solo_b = _solo(engine, PROMPT, greedy(12), "ad1"), _solo(engine, PROMPT[:4], greedy(6), "ad3")
    engine.add_request("x", PROMPT, greedy(12), "ad1")
    outs = {"x": [], "y": []}
    for _ in range(3):
        for o in engine.step():
            outs[o.request_id].append(o)
    engine.add_request("y", PROMPT[:4], greedy(6), "ad3")
    step = engine.step()
    assert {o.request_id for o in step} == {"x", "y"}  # y prefills in the same step as x decodes
    for o in step:
        outs[o.request_id].append(o)
    for rid, o in run_all(engine).items():
        outs[rid] += o
    assert tokens(outs["x"]) == solo_a and tokens(outs["y"]) == solo_b


def test_cancel_frees_row_and_adapter_pin(tiny_model_dir: Path, adapters: dict[str, Path]) -> None:
    engine, manager = make_engine(tiny_model_dir, adapters, {8: 1, 16: 1}, max_num_seqs=2)
    engine.add_request("x", PROMPT, greedy(50), "ad1")
    engine.step()
    assert engine.scheduler.rows.num_free == 1 and manager.table.lookup("ad1").ref_count == 1
    assert engine.abort("x")
    assert engine.scheduler.rows.num_free == 2 and manager.table.lookup("ad1").ref_count == 0
    assert not engine.has_work()
    manager.load(manager.host["ad2"])  # a is idle now, so its only rank-8 slot may be taken
    assert manager.tier("ad1") == "ram"


def test_max_tokens_ends_with_length(tiny_model_dir: Path, adapters: dict[str, Path]) -> None:
    engine, _ = make_engine(tiny_model_dir, adapters, {8: 1})
    engine.add_request("x", PROMPT, greedy(7))
    outs = run_all(engine)["x"]
    assert len(tokens(outs)) == 7 and outs[-1].finished and outs[-1].finish_reason == "length"
    assert outs[-1].completion_tokens == 7 and outs[-1].prompt_tokens == len(PROMPT)


def test_stop_string_ends_generation_and_is_not_emitted(
    tiny_model_dir: Path, adapters: dict[str, Path]
) -> None:
    engine, _ = make_engine(tiny_model_dir, adapters, {8: 1})
    engine.add_request("full", PROMPT, greedy(20))
    full = "".join(o.text for o in run_all(engine)["full"])
    stop = full[6:9]
    engine.add_request("x", PROMPT, greedy(20, stop=(stop,)))
    outs = run_all(engine)["x"]
    text = "".join(o.text for o in outs)
    assert text == full[: full.index(stop)] and outs[-1].finish_reason == "stop"
    assert len(tokens(outs)) < 20


def test_eos_stops_unless_ignored(tiny_model_dir: Path, adapters: dict[str, Path]) -> None:
    engine, _ = make_engine(tiny_model_dir, adapters, {8: 1})
    first = _solo(engine, PROMPT, greedy(5))
    engine.eos_token_ids = {first[2]}
    engine.add_request("x", PROMPT, SamplingParams(temperature=0.0, max_tokens=5))
    outs = run_all(engine)["x"]
    assert tokens(outs) == first[: first.index(first[2]) + 1] and outs[-1].finish_reason == "stop"


def test_seed_makes_sampling_reproducible(tiny_model_dir: Path, adapters: dict[str, Path]) -> None:
    engine, _ = make_engine(tiny_model_dir, adapters, {8: 2})
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=1234, max_tokens=16, ignore_eos=True)
    one = _solo(engine, PROMPT, params, "ad1")
    engine.add_request(
        "other", PROMPT[:3], SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True), "ad2"
    )
    engine.add_request("solo", PROMPT, params, "ad1")
    two = tokens(run_all(engine)["solo"])
    other_seed = _solo(
        engine, PROMPT, SamplingParams(temperature=1.0, seed=99, max_tokens=16, ignore_eos=True), "ad1"
    )
    assert one == two and one != other_seed


def test_evicted_then_reloaded_adapter_gives_identical_tokens(
    tiny_model_dir: Path, adapters: dict[str, Path]
) -> None:
    engine, manager = make_engine(tiny_model_dir, adapters, {8: 1, 16: 1})
    before = _solo(engine, PROMPT, greedy(10), "ad1")
    _solo(engine, PROMPT, greedy(3), "ad2")  # b takes the only rank-8 slot: a is evicted
    assert manager.tier("ad1") == "ram" and manager.table.evictions == 1
    assert _solo(engine, PROMPT, greedy(10), "ad1") == before


def test_running_adapter_is_never_evicted(tiny_model_dir: Path, adapters: dict[str, Path]) -> None:
    engine, manager = make_engine(tiny_model_dir, adapters, {8: 1, 16: 1})
    solo_a = _solo(engine, PROMPT, greedy(10), "ad1")
    engine.add_request("x", PROMPT, greedy(10), "ad1")
    engine.add_request("y", PROMPT, greedy(4), "ad2")  # needs a's slot: must wait until x ends
    outs = {"x": [], "y": []}
    for o in engine.step():
        outs[o.request_id].append(o)
    assert [s.request_id for s in engine.scheduler.waiting] == ["y"]
    with pytest.raises(NoFreeSlotError):
        manager.load(manager.host["ad2"])  # an explicit load cannot take a running adapter's slot either
    for rid, o in run_all(engine).items():
        outs[rid] += o
    assert tokens(outs["x"]) == solo_a and len(tokens(outs["y"])) == 4


def test_bad_requests_are_refused(tiny_model_dir: Path, adapters: dict[str, Path]) -> None:
    engine, _ = make_engine(tiny_model_dir, adapters, {8: 1})
    with pytest.raises(ContextLengthError):
        engine.add_request("x", [1] * 200, greedy(3))
    with pytest.raises(InvalidRequestError):
        engine.add_request("x", [], greedy(3))
    with pytest.raises(InvalidRequestError):
        engine.add_request("x", PROMPT, SamplingParams(top_p=0.0))
    engine.add_request("x", PROMPT, greedy(3), "not-loaded")
    outs = run_all(engine)["x"]
    assert outs[-1].finished and outs[-1].finish_reason == "error" and "not-loaded" in outs[-1].error


def test_step_refuses_a_row_whose_slot_holds_another_adapter(
    tiny_model_dir: Path, adapters: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    engine, manager = make_engine(tiny_model_dir, adapters, {8: 2})
    engine.add_request("x", PROMPT, greedy(5), "ad1")
    with caplog.at_level(logging.INFO, logger="replica.engine"):
        engine.step()
    assert any("request x adapter=ad1" in r.getMessage() for r in caplog.records)  # logged at admission
    ref = manager.table.lookup("ad1").ref
    manager.table._by_slot[ref] = "ad2"  # simulate a slot-table bug: the slot now claims another adapter
    engine.add_request("y", PROMPT, greedy(2))  # a base row in the same batch is unaffected
    outs = engine.step()
    (refused,) = [o for o in outs if o.request_id == "x"]
    assert refused.finished and refused.token_id is None and refused.error.startswith("slot_mismatch")
    assert [o.request_id for o in outs if o.request_id == "y"] == ["y"]
    assert "x" not in engine.seqs
