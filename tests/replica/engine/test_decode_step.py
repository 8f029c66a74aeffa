"""The decode step on static buffers: padding stays in the sink, buffers carry nothing from step to step,
and its logits equal the packed path's."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from replica.engine.decode_step import MAX_RANK_BUCKETS, DecodeRow, batch_buckets
from replica.engine.model_runner import ModelRunner, StepInput
from replica.lora.replace import apply_lora
from replica.lora.slots import SlotRef
from replica.model.loader import load_model

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
CAPACITIES = {8: 3, 16: 3}


@pytest.fixture
def runner(tiny_model_dir: Path) -> ModelRunner:
    """A tiny fused model with random adapters in two rank buckets, six rows of eight prompt tokens cached."""
    torch.manual_seed(0)
    model = load_model(tiny_model_dir, "float32", "cpu")
    for wrapper in apply_lora(model, TARGETS, CAPACITIES).values():
        for pool in wrapper.pools.values():
            with torch.no_grad():
                pool.a.normal_(0.0, 0.3)
                pool.b.normal_(0.0, 0.3)
                pool.scale.fill_(2.0)
    r = ModelRunner(model, max_num_seqs=6, max_model_len=64)
    r.run([StepInput([3 + i] * 8, 0, r.row_table(i)) for i in range(6)])
    return r


SLOTS = [None, SlotRef(8, 0), SlotRef(16, 2), SlotRef(16, 0), None, SlotRef(8, 1)]


def _decode(runner: ModelRunner, rows: list[int], tokens: list[int]) -> list[StepInput]:
    return [StepInput([t], 8, runner.row_table(i), SLOTS[i]) for i, t in zip(rows, tokens, strict=True)]


def test_batch_buckets_cover_every_size_up_to_the_largest() -> None:
    for max_rows in (1, 3, 8, 32, 33, 256):
        sizes = batch_buckets(max_rows)
        assert sizes[-1] == max_rows and sizes == sorted(set(sizes))
        assert all(next(b for b in sizes if b >= n) - n < 8 for n in range(1, max_rows + 1))


def test_decode_logits_equal_the_packed_path_with_mixed_buckets(runner: ModelRunner) -> None:
    steps = _decode(runner, [0, 1, 2, 3, 4], [11, 12, 13, 14, 15])  # 5 rows: padded to 8, buckets 8 and 16
    static = runner.run(steps)  # [5, vocab]
    for s in steps:  # the packed path writes the same K/V again: run it on identical inputs
        assert len(s.token_ids) == 1
    packed = runner.run(steps, all_logits=True)  # the per-step packed path (one logit row per token)
    assert static.shape == packed.shape == (5, runner.model.config.vocab_size)
    torch.testing.assert_close(static, packed, atol=1e-5, rtol=1e-5)
    assert (static[1] - static[0]).abs().max() > 1e-2  # adapters change the rows: the check can fail


def test_padding_rows_write_only_the_sink_block(runner: ModelRunner) -> None:
    kv = runner.kv
    before_k, before_v = kv.k.clone(), kv.v.clone()
    steps = _decode(runner, [0, 2, 5], [20, 21, 22])  # 3 rows padded to 4
    assert runner.decode.padded_size(3) == 4
    logits = runner.run(steps)
    assert logits.shape[0] == 3
    written = {runner.row_table(i)[8 // runner.block_size] for i in (0, 2, 5)}
    for block in range(kv.num_blocks):
        same = torch.equal(kv.k[:, block], before_k[:, block]) and torch.equal(
            kv.v[:, block], before_v[:, block]
        )
        assert same != (block in written), f"block {block}"
    assert not torch.equal(kv.k[:, kv.sink_block], before_k[:, kv.sink_block])  # the padding row went here


def test_a_step_carries_nothing_from_the_step_before(runner: ModelRunner) -> None:
    """A smaller batch after a larger one, and a base-only batch after adapted ones, equal fresh runs."""
    runner.run(_decode(runner, [0, 1, 2, 3, 4, 5], [30, 31, 32, 33, 34, 35]))
    small = runner.run(_decode(runner, [4, 0], [40, 41]))  # both rows base only: no adapter kernel
    ref = runner.run(_decode(runner, [4, 0], [40, 41]), all_logits=True)
    torch.testing.assert_close(small, ref, atol=1e-5, rtol=1e-5)
    mixed = runner.run(_decode(runner, [3], [50]))  # one bucket-16 row after rows of both buckets
    torch.testing.assert_close(
        mixed, runner.run(_decode(runner, [3], [50]), all_logits=True), atol=1e-5, rtol=1e-5
    )


def test_prepare_refuses_more_rows_than_the_buffers_hold(runner: ModelRunner) -> None:
    rows = [DecodeRow(1, 8, runner.row_table(0), None)] * 7
    with pytest.raises(ValueError, match="1 to 6 rows"):
        runner.decode.prepare(rows)


def test_prepare_refuses_more_rank_buckets_than_it_has_columns(runner: ModelRunner) -> None:
    buckets = [2 ** (i + 1) for i in range(MAX_RANK_BUCKETS + 1)]
    rows = [DecodeRow(1, 8, runner.row_table(0), SlotRef(b, 0)) for b in buckets[:5]]
    runner.decode.prepare(rows)
    with pytest.raises(ValueError, match="rank buckets"):
        runner.decode.prepare([DecodeRow(1, 8, runner.row_table(0), SlotRef(b, 0)) for b in buckets[5:]])


def test_cuda_graphs_on_the_cpu_run_eagerly_and_say_so(tiny_model_dir: Path, caplog) -> None:
    model = load_model(tiny_model_dir, "float32", "cpu")
    with caplog.at_level(logging.INFO):
        r = ModelRunner(model, max_num_seqs=2, max_model_len=32, cuda_graphs=True)
    assert r.graphs is None and "run eagerly" in caplog.text
    r.run([StepInput([5] * 4, 0, r.row_table(0))])
    assert r.run([StepInput([6], 4, r.row_table(0))]).shape == (1, model.config.vocab_size)


def test_rows_for_capturing_ahead_touch_only_the_sink(runner: ModelRunner) -> None:
    kv = runner.kv
    before_k = kv.k.clone()
    for bucket in (None, 16):
        batch = runner.decode.prepare(runner.decode.dummy_rows(6, bucket))
        runner.decode.forward(batch.padded, batch.buckets, batch.max_blocks)
    assert torch.equal(kv.k[:, : kv.num_blocks], before_k[:, : kv.num_blocks])
    assert runner.capture_graphs((8, 16)) == 0  # the CPU runner is eager: nothing to capture


def test_more_rank_buckets_than_a_step_serves_are_refused_at_start(runner: ModelRunner) -> None:
    with pytest.raises(ValueError, match="at most"):
        runner.capture_graphs(tuple(2 ** (i + 1) for i in range(MAX_RANK_BUCKETS + 1)))


def test_every_column_past_a_rows_blocks_names_the_sink(runner: ModelRunner) -> None:
    """The block table is a security boundary: after a step of long rows, a step of short ones leaves no
    block of theirs (or of anyone) past each row's own, padding rows included."""
    step, sink = runner.decode, runner.kv.sink_block
    long_rows = [DecodeRow(1, 60, runner.row_table(i), None) for i in range(6)]  # 4 blocks each
    step.prepare(long_rows)
    short = [DecodeRow(1, 8, runner.row_table(i), None) for i in (2, 4, 5)]  # 1 block each, padded to 4
    batch = step.prepare(short)
    tables = step.staging.dev.tables[: batch.padded]  # [padded, width]
    assert batch.padded == 4 and batch.max_blocks == 1
    assert tables[:3, 0].tolist() == [runner.row_table(i)[0] for i in (2, 4, 5)]
    assert torch.all(tables[:3, 1:] == sink) and torch.all(tables[3] == sink)
