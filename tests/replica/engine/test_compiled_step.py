"""The compiled decode step (the CPU's counterpart of CUDA graphs) gives the eager step's logits for every kind
of batch, and a compile that fails leaves the runner serving eagerly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from replica.engine.model_runner import ModelRunner, StepInput
from replica.lora.replace import apply_lora
from replica.lora.slots import SlotRef
from replica.model.loader import load_model

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
CAPACITIES = {8: 4, 16: 6}
ROWS = 6


def _runner(model_dir: Path, compile_decode: bool) -> ModelRunner:
    torch.manual_seed(0)
    model = load_model(model_dir, "float32", "cpu")
    for wrapper in apply_lora(model, TARGETS, CAPACITIES).values():
        for pool in wrapper.pools.values():
            with torch.no_grad():
                pool.a.normal_(0.0, 0.3)
                pool.b.normal_(0.0, 0.3)
                pool.scale.uniform_(0.5, 2.0)
    r = ModelRunner(model, max_num_seqs=ROWS, max_model_len=64, compile_decode=compile_decode)
    r.capture_graphs(tuple(sorted(CAPACITIES)))
    r.run([StepInput([3 + i] * 8, 0, r.row_table(i)) for i in range(ROWS)])
    return r


# (rows, slots): mostly distinct adapters in one bucket and shared ones in the other, distinct ones beside a
# base row, one adapter over every row, base rows only, a lone row
BATCHES = [
    (
        [0, 1, 2, 3, 4, 5],
        [SlotRef(16, 5), SlotRef(16, 1), SlotRef(8, 3), SlotRef(16, 0), SlotRef(16, 2), SlotRef(8, 3)],
    ),
    ([0, 1, 2, 3], [SlotRef(16, 3), None, SlotRef(16, 4), SlotRef(16, 5)]),
    ([0, 1, 2, 3], [SlotRef(16, 2)] * 4),
    ([1, 4, 5], [None, None, None]),
    ([2], [SlotRef(8, 2)]),
]


@pytest.fixture(scope="module")
def runners(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModelRunner, ModelRunner]:
    from canary.tiny_base import write_tiny_base

    model_dir = write_tiny_base(tmp_path_factory.mktemp("compiled") / "base")
    return _runner(model_dir, False), _runner(model_dir, True)


def test_compiled_steps_give_the_eager_logits_for_every_kind_of_batch(
    runners: tuple[ModelRunner, ModelRunner],
) -> None:
    eager, compiled = runners
    assert compiled.compiled is not None and eager.compiled is None
    position = 8
    for rows, slots in BATCHES * 2:  # twice: steps after the first compile of each shape
        steps = [
            StepInput([20 + i], position, eager.row_table(i), s) for i, s in zip(rows, slots, strict=True)
        ]
        want = eager.run(steps)  # both runners have the same block tables: row i owns the same blocks
        got = compiled.run(steps)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        assert torch.equal(got.argmax(-1), want.argmax(-1))
        position += 1
    assert compiled.compiled.compiled is not None and compiled.compiled.failures == 0  # never fell back
    adapted = eager.run([StepInput([9], position, eager.row_table(0), SlotRef(16, 5))])
    base = eager.run([StepInput([9], position, eager.row_table(0), None)])
    assert (adapted - base).abs().max() > 1e-2  # the adapters change the logits: the comparison can fail


def test_a_compile_that_fails_leaves_the_step_eager(tiny_model_dir: Path, caplog) -> None:
    model = load_model(tiny_model_dir, "float32", "cpu")
    r = ModelRunner(model, max_num_seqs=2, max_model_len=32, compile_decode=True)
    assert r.compiled is not None

    def broken(*args: object) -> torch.Tensor:
        raise RuntimeError("no C++ compiler")

    r.compiled.compiled = broken
    r.run([StepInput([5] * 4, 0, r.row_table(0))])
    logits = r.run([StepInput([6], 4, r.row_table(0))])
    assert logits.shape == (1, model.config.vocab_size) and torch.isfinite(logits).all()
    assert r.compiled.compiled is None and r.compiled.failures == 1
    assert "run eagerly" in caplog.text
    again = r.run([StepInput([6], 4, r.row_table(0))])  # the same K/V rewritten: the same logits
    torch.testing.assert_close(again, logits)
