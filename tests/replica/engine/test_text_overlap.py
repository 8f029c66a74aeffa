"""Text after the next launch (overlap_text): the same outputs as at once, one step later, nothing leaked.

On CUDA the engine detokenizes and scans stop strings while the device computes the next step; a row that a
stop string ended meanwhile drops the token it was computing. These tests run that order on the CPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from replica.engine.engine import StepOutput
from replica.engine.sampler import SamplingParams
from tests.replica.engine.engine_util import RecordingDetokenizer, Served, greedy, make_engine, tokens
from tests.replica.peft_util import AdapterRecipe, make_peft_adapters

PROMPT = [5, 17, 42, 99, 7, 3]


@pytest.fixture(scope="module")
def adapters(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    recipes = [AdapterRecipe("ad1", 8, 16, seed=1), AdapterRecipe("ad2", 8, 16, seed=2)]
    _, dirs = make_peft_adapters(tiny_model_dir, tmp_path_factory.mktemp("overlap"), recipes, std=0.3)
    return dirs


def _served(base: Path, adapters: dict[str, Path], tmp: Path, overlap: bool) -> Served:
    return make_engine(base, adapters, {8: 2}, tmp, overlap_text=overlap)


def _summary(outs: list[StepOutput]) -> tuple[str, list[int], str | None, int]:
    last = outs[-1]
    assert last.finished and all(not o.finished for o in outs[:-1])
    return "".join(o.text for o in outs), tokens(outs), last.finish_reason, last.completion_tokens


async def _mixed_run(served: Served, stop: str, eos: int) -> dict[str, tuple]:
    """A batch of rows ending every way: length, a stop string, a stop token, under two adapters and none."""
    served.engine.eos_token_ids = {eos}
    await served.add("long", PROMPT, greedy(14), "ad1")
    await served.add("stop-string", PROMPT, greedy(20, stop=(stop,)))
    await served.add("short", PROMPT[:3], greedy(2), "ad2")
    await served.add("stop-token", PROMPT, SamplingParams(temperature=0.0, max_tokens=12))
    await served.add("sampled", PROMPT[1:], SamplingParams(temperature=0.9, seed=7, max_tokens=9), "ad2")
    return {rid: _summary(outs) for rid, outs in served.run_all().items()}


async def test_overlap_gives_the_same_outputs_and_frees_every_block(
    tiny_model_dir: Path, adapters: dict[str, Path], tmp_path: Path
) -> None:
    probe = _served(tiny_model_dir, adapters, tmp_path / "probe", overlap=False)
    await probe.add("full", PROMPT, greedy(20))
    full = probe.run_all()["full"]
    text, ids = "".join(o.text for o in full), tokens(full)
    stop, eos = text[5:7], ids[4]
    runs = {}
    for overlap in (False, True):
        served = _served(tiny_model_dir, adapters, tmp_path / str(overlap), overlap)
        runs[overlap] = await _mixed_run(served, stop, eos)
        engine = served.engine
        assert not engine.seqs and not engine.has_work()
        assert engine.blocks.num_free == engine.blocks.num_blocks and not served.leases
        engine.blocks.check()
    assert runs[True] == runs[False]
    assert runs[True]["stop-string"][2] == "stop" and stop not in runs[True]["stop-string"][0]
    assert runs[True]["stop-token"][2] == "stop" and runs[True]["long"][2] == "length"


@pytest.mark.parametrize(
    ("overlap", "expected"),
    [
        (False, ["run", "text"] * 4),
        (True, ["run", "run", "text", "run", "text", "run", "text", "text"]),
    ],
)
async def test_text_follows_the_next_launch_only_with_overlap(
    tiny_model_dir: Path, adapters: dict[str, Path], tmp_path: Path, overlap: bool, expected: list[str]
) -> None:
    served = _served(tiny_model_dir, adapters, tmp_path, overlap)
    engine, events = served.engine, []
    engine.detokenizer_factory = lambda: RecordingDetokenizer(events)
    launch = engine.runner.run

    def run(steps: list) -> object:
        events.append("run")
        return launch(steps)

    engine.runner.run = run  # type: ignore[method-assign]
    await served.add("x", PROMPT, greedy(4))
    outs = served.run_all()["x"]
    assert events == expected and len(tokens(outs)) == 4


async def test_a_finished_row_waiting_for_its_text_still_ends_when_the_rest_is_aborted(
    tiny_model_dir: Path, adapters: dict[str, Path], tmp_path: Path
) -> None:
    served = _served(tiny_model_dir, adapters, tmp_path, overlap=True)
    await served.add("one", PROMPT, greedy(1))
    await served.add("many", PROMPT, greedy(10))
    assert served.step() == []  # both tokens wait for the next launch
    assert served.engine.abort("many")
    assert served.engine.has_work()
    outs = served.step()
    assert [(o.request_id, o.finished, o.finish_reason, o.completion_tokens) for o in outs] == [
        ("one", True, "length", 1)
    ]
    assert not served.engine.has_work() and served.engine.blocks.num_free == served.engine.blocks.num_blocks


async def test_a_failed_step_ends_rows_waiting_for_their_text(
    tiny_model_dir: Path, adapters: dict[str, Path], tmp_path: Path
) -> None:
    served = _served(tiny_model_dir, adapters, tmp_path, overlap=True)
    await served.add("one", PROMPT, greedy(1))
    await served.add("many", PROMPT, greedy(10))
    served.step()
    outs = served.engine.fail_running("engine error: boom")
    assert sorted((o.request_id, o.finish_reason, o.error) for o in outs) == [
        ("many", "error", "engine error: boom"),
        ("one", "error", "engine error: boom"),
    ]
    assert not served.engine.has_work() and served.engine.blocks.num_free == served.engine.blocks.num_blocks
