"""The next decode step staged while the device runs this one: what prepare() finishes from it equals a
fresh build, whatever changed in between, and an engine staging ahead gives the same outputs.

On CUDA the engine stages the next step's rows after this step's launch; these tests run that order on the
CPU, where the staging path is the same code and only the copy differs.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from replica.engine import engine as engine_module
from replica.engine.decode_staging import DecodeRow, DecodeStaging, Staged
from replica.engine.sampler import PendingSample, SamplingParams
from replica.lora.slots import SlotRef
from tests.replica.engine.engine_util import RecordingDetokenizer, Served, greedy, make_engine, tokens
from tests.replica.peft_util import AdapterRecipe, make_peft_adapters

ROWS, WIDTH, BS, SINK = 8, 6, 4, 99


def _staging(separate: bool = False) -> DecodeStaging:
    """separate: the device path's two host buffers, each step copied into a buffer of its own."""
    return DecodeStaging(ROWS, WIDTH, BS, SINK, torch.device("cpu"), separate=separate)


def _view(staging: DecodeStaging, s: Staged) -> tuple[list, list, dict[int, list]]:
    """What the forward reads of a staged batch: scalars, tables and each present bucket's slots."""
    dev, b = staging.dev, s.padded
    slots = {k: dev.slots[staging.bucket_column[k], :b].tolist() for k in s.buckets}
    return dev.scalars[:, :b].tolist(), dev.tables[:b].tolist(), slots


def _row(rng: random.Random, owner: int, length: int, slot: SlotRef | None) -> DecodeRow:
    blocks = [owner * 10 + j for j in range(length // BS + 1)]
    return DecodeRow(rng.randrange(50), length, blocks, slot)


def _moved(rng: random.Random, rows: list[DecodeRow]) -> list[DecodeRow]:
    """The next step's real rows: mostly each row one position on, sometimes changed some other way."""
    out = []
    for r in rows:
        case = rng.random()
        blocks = list(r.block_table)
        position = r.position + 1
        if position // BS >= len(blocks):
            blocks.append(blocks[-1] + 1)  # crossed into a new block
        slot = r.slot
        if case < 0.06:
            slot = None if slot is not None else SlotRef(8, rng.randrange(4))
        elif case < 0.12 and slot is not None:
            slot = SlotRef(slot.bucket, slot.index + 1)  # same bucket, another adapter's slot
        elif case < 0.18 and len(blocks) > 1:
            blocks[0] += 500  # same length and last block, another block under it: another sequence's
        elif case < 0.24 and (position + 1) // BS < len(blocks):
            position += 1  # same table, another position in it
        elif case < 0.30:
            continue  # ended
        out.append(DecodeRow(rng.randrange(50), position, blocks, slot))
    if rng.random() < 0.2:
        out.reverse()
    return out or rows[:1]


@pytest.mark.parametrize("separate", [False, True])
def test_prepare_after_staging_ahead_equals_a_fresh_build(
    separate: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(0)
    ahead, fresh = _staging(separate), _staging()
    _refuse_writing_the_buffer_in_flight(ahead, monkeypatch)
    for _ in range(300):
        n = rng.randrange(1, ROWS + 1)
        slots = [None, SlotRef(8, 0), SlotRef(8, 1), SlotRef(16, 2)]
        rows = [_row(rng, i, rng.randrange(1, BS * WIDTH - 2), rng.choice(slots)) for i in range(n)]
        expected = [DecodeRow(0, r.position + 1, r.block_table, r.slot) for r in rows]
        ahead.stage_ahead(expected, max(1, 1 << (len(expected) - 1).bit_length()))
        real = _moved(rng, rows)
        padded = max(1, 1 << (len(real) - 1).bit_length())
        got, want = ahead.prepare(real, padded), fresh.prepare(real, padded)
        assert got == want
        assert _view(ahead, got) == _view(fresh, want)
    assert (
        ahead.counts["ahead_used"] > 100
        and ahead.counts["ahead_missed"] > 20
        and ahead.counts["rows_rebuilt"] > 100
    )


def _refuse_writing_the_buffer_in_flight(staging: DecodeStaging, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a separate device buffer, the host buffer copied last may still be in flight (on CUDA its copy
    is asynchronous): nothing writes it until another has been copied."""
    in_flight: list[object] = []
    publish = staging._publish

    def published(buf: object) -> None:
        publish(buf)  # type: ignore[arg-type]
        in_flight[:] = [buf]

    monkeypatch.setattr(staging, "_publish", published)
    for name in ("_build", "_rebuild"):

        def checked(buf: object, *args: object, real: object = getattr(staging, name)) -> object:
            assert staging.on_host or buf not in in_flight, "a host buffer was written while in flight"
            return real(buf, *args)  # type: ignore[operator]

        monkeypatch.setattr(staging, name, checked)


def test_a_row_another_sequence_took_over_is_rebuilt_in_full() -> None:
    """Same position, length and last block, another block under it: the table is compared in full."""
    staging = _staging()
    mine = DecodeRow(0, 9, [1, 2, 3], SlotRef(8, 0))
    other = DecodeRow(7, 9, [40, 2, 3], SlotRef(8, 0))
    staging.stage_ahead([mine, mine], 2)
    s = staging.prepare([mine, other], 2)
    assert staging.dev.tables[1, :3].tolist() == [40, 2, 3] and s.rows == 2
    assert staging.counts == {"ahead_used": 1, "rows_rebuilt": 1}


def test_a_row_whose_next_block_is_not_allocated_yet_is_staged_as_padding() -> None:
    staging = _staging()
    staging.stage_ahead([DecodeRow(0, 8, [1, 2], None)], 1)  # position 8 needs a third block
    assert staging.hosts[1].tables[0].tolist() == [SINK] * WIDTH
    staging.prepare([DecodeRow(5, 8, [1, 2, 3], None)], 1)
    assert staging.dev.tables[0, :3].tolist() == [1, 2, 3] and staging.dev.scalars[:4, 0].tolist() == [
        5,
        8,
        3 * BS,
        9,
    ]


# the engine


@pytest.fixture(scope="module")
def adapters(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    recipes = [AdapterRecipe("ad1", 8, 16, seed=1), AdapterRecipe("ad2", 8, 16, seed=2)]
    _, dirs = make_peft_adapters(tiny_model_dir, tmp_path_factory.mktemp("ahead"), recipes, std=0.3)
    return dirs


async def _run(served: Served, eos: int) -> dict[str, tuple[list[int], str | None]]:
    """Rows ending every way (length, a stop token, a stop string), on two adapters and none, which
    cross block boundaries while they decode."""
    served.engine.eos_token_ids = {eos}
    prompt = [5, 17, 42, 99, 7, 3]
    await served.add("long", prompt, greedy(30), "ad1")
    await served.add("short", prompt[:3], greedy(3), "ad2")
    await served.add("stop-token", prompt, SamplingParams(temperature=0.0, max_tokens=25))
    await served.add("sampled", prompt[1:], SamplingParams(temperature=0.9, seed=7, max_tokens=22), "ad2")
    await served.add("stop-string", prompt, greedy(26, stop=("q",)), "ad1")
    await served.add("late", prompt[2:], greedy(12), "ad1")  # waits for a row: a step with admissions
    out = served.run_all()
    return {rid: (tokens(o), o[-1].finish_reason) for rid, o in out.items()}


@pytest.mark.parametrize(("overlap", "separate"), [(False, False), (True, True)])
async def test_an_engine_staging_ahead_gives_the_same_outputs(
    tiny_model_dir: Path, adapters: dict[str, Path], tmp_path: Path, overlap: bool, separate: bool
) -> None:
    """separate: the forward reads a device buffer of its own, as on CUDA."""
    probe = make_engine(tiny_model_dir, adapters, {8: 2}, tmp_path / "probe")
    await probe.add(
        "p", [5, 17, 42, 99, 7, 3], SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    )
    eos = tokens(probe.run_all()["p"])[9]  # a token the stop-token row meets part way
    runs = {}
    for ahead in (False, True):
        served = make_engine(
            tiny_model_dir,
            adapters,
            {8: 2},
            tmp_path / f"{ahead}",
            max_num_seqs=5,
            num_blocks=40,
            overlap_text=overlap,
            prepare_ahead=ahead,
        )
        step = served.engine.runner.decode
        step.staging = DecodeStaging(
            step.max_rows, step.width, step.block_size, step.sink_block, step.device, separate=separate
        )
        runs[ahead] = await _run(served, eos)
        engine = served.engine
        assert engine.blocks.num_free == engine.blocks.num_blocks and not engine.seqs
        counts = engine.runner.decode.staging.counts
        if ahead:
            assert counts["ahead_used"] > 10 and counts["rows_rebuilt"] > 0 and counts["ahead_missed"] > 0
        else:
            assert not counts
    assert runs[True] == runs[False]
    assert runs[True]["stop-token"][1] == "stop" and runs[True]["long"][1] == "length"


async def test_the_host_work_of_a_step_sits_between_its_launches_and_its_one_read(
    tiny_model_dir: Path, adapters: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Forward, then the draw, both queued; then the last step's text and the next step's staging; then
    the read of the chosen ids."""
    served = make_engine(tiny_model_dir, adapters, {8: 2}, tmp_path, overlap_text=True, prepare_ahead=True)
    engine, events = served.engine, []
    runner = engine.runner
    run, stage, launch = runner.run, runner.stage_ahead, engine_module.launch_sample

    class Pending:
        def __init__(self, real: PendingSample) -> None:
            self.real = real

        def read(self) -> object:
            events.append("read")
            return self.real.read()

    def launch_logged(*args: object) -> Pending:
        events.append("draw")
        return Pending(launch(*args))  # type: ignore[arg-type]

    monkeypatch.setattr(runner, "run", lambda steps: (events.append("run"), run(steps))[1])
    monkeypatch.setattr(runner, "stage_ahead", lambda steps: (events.append("stage"), stage(steps))[1])
    monkeypatch.setattr(engine_module, "launch_sample", launch_logged)
    engine.detokenizer_factory = lambda: RecordingDetokenizer(events)
    await served.add("x", [5, 17, 42], greedy(3))
    served.run_all()
    step = ["run", "draw"]
    # the last step stages no row (its one row ends with this token), and its text follows at once
    assert events == [*step, "stage", "read", *[*step, "text", "stage", "read"] * 2, "text"]


async def test_a_failed_staging_loses_no_output(
    tiny_model_dir: Path, adapters: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Staging ahead runs after the last step's text was taken: if it raised, that text would be lost. It
    only saves time, so a failure is logged and the next step builds its own inputs."""
    outs = {}
    for ahead in (False, True):
        served = make_engine(tiny_model_dir, adapters, {8: 2}, tmp_path / f"{ahead}", prepare_ahead=ahead)
        staging = served.engine.runner.decode.staging
        real = staging.stage_ahead

        def broken(rows: list[DecodeRow], padded: int, real: object = real) -> None:
            if rows:
                raise RuntimeError("injected")
            real(rows, padded)  # type: ignore[operator]

        monkeypatch.setattr(staging, "stage_ahead", broken)
        await served.add("a", [5, 17, 42], greedy(6), "ad1")
        await served.add("b", [9, 3], greedy(4))
        outs[ahead] = {rid: tokens(o) for rid, o in served.run_all().items()}
        assert served.engine.blocks.num_free == served.engine.blocks.num_blocks
    assert outs[True] == outs[False] and len(outs[True]["a"]) == 6
