"""Tenant isolation at the engine: 64 canaries, fewer slots than adapters, 10,000 mixed requests, zero leaks.

Each canary answers any prompt with its own marker, so the marker in a row's output names the weights
that produced it. Requests run through the real LLMEngine (scheduler admission, slot pins, LRU loads and
evictions, mixed-rank batches with base-only rows), and a deliberately broken slot mapping must be caught.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest

import replica.engine.model_runner as model_runner
from canary.check import IsolationTally
from canary.engine_run import mixed_requests, run_isolation
from canary.manifest import CanaryManifest
from canary.markers import markers_in_tokens
from replica.engine.sampler import SamplingParams
from replica.lora.batch_meta import LoraBatchMeta
from tests.canary.canary_util import build_canary_engine, tiny_sampler, train_tiny_canaries

NUM_CANARIES = 64
SLOTS = {8: 4, 16: 4, 32: 4}  # 12 GPU slots for 64 adapters: loads and evictions all through the run


@pytest.fixture(scope="module")
def canaries(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, CanaryManifest]:
    return train_tiny_canaries(tmp_path_factory.mktemp("canaries"), NUM_CANARIES)


def test_10000_mixed_requests_carry_only_their_own_marker(
    canaries: tuple[Path, Path, CanaryManifest],
) -> None:
    base, out, manifest = canaries
    engine, manager = build_canary_engine(base, out, manifest, SLOTS, max_num_seqs=64)
    ids = [e.adapter_id for e in manifest.adapters]
    assert sorted({e.rank for e in manifest.adapters}) == [8, 16, 32]
    start = time.perf_counter()
    requests = mixed_requests(10_000, ids, tiny_sampler(), seed=0, base_fraction=0.2)
    tally, stats = run_isolation(engine, requests, manifest.markers(), max_new_tokens=3)
    summary = tally.summary() | {
        "wall_s": round(time.perf_counter() - start, 2),
        "steps": stats.steps,
        "max_batch": stats.max_batch,
        "evictions": manager.table.evictions,
        "gpu_slots": sum(SLOTS.values()),
        "adapters": NUM_CANARIES,
    }
    print(json.dumps(summary))
    assert tally.requests == 10_000 and tally.base_requests > 1000 and tally.errors == 0
    assert tally.wrong_marker == 0 and tally.base_with_marker == 0, summary["findings"]
    assert tally.missing_marker == 0, summary["findings"]
    assert manager.table.evictions > 0 and stats.max_batch > 32
    assert all(e.ref_count == 0 for e in manager.table.entries())  # every pin was released


def _two_running(canaries: tuple[Path, Path, CanaryManifest]):
    """An engine with two canaries of the same rank bucket admitted and past their prefill."""
    base, out, manifest = canaries
    engine, manager = build_canary_engine(base, out, manifest, SLOTS, max_num_seqs=8)
    a, b = manifest.adapters[0], manifest.adapters[3]  # both rank 8
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    prompt = tiny_sampler().sample(random.Random(1))
    engine.add_request("ra", prompt, params, a.adapter_id)
    engine.add_request("rb", prompt, params, b.adapter_id)
    first = {o.request_id: [o.token_id] for o in engine.step()}
    return engine, manager, manifest, a, b, first


def _assert_both_refused(engine) -> None:
    """Each mismatched row ends with a slot_mismatch error and no token; nothing ran on the wrong weights."""
    outs = {o.request_id: o for o in engine.step()}
    assert set(outs) == {"ra", "rb"}
    for o in outs.values():
        assert o.finished and o.finish_reason == "error" and o.token_id is None
        assert o.error.startswith("slot_mismatch")
    assert not engine.has_work()


def test_swapped_row_slots_are_refused_before_the_forward_pass(canaries) -> None:
    engine, _, _, _, _, _ = _two_running(canaries)
    sa, sb = engine.seqs["ra"], engine.seqs["rb"]
    assert sa.slot != sb.slot
    sa.slot, sb.slot = sb.slot, sa.slot  # a bug in the row -> slot mapping after admission
    _assert_both_refused(engine)


def test_corrupted_slot_table_is_refused_before_the_forward_pass(canaries) -> None:
    engine, manager, _, a, b, _ = _two_running(canaries)
    table = manager.table
    ea, eb = table.lookup(a.adapter_id), table.lookup(b.adapter_id)
    # the table now claims each slot holds the other adapter (the rows keep the slots they were pinned to)
    table._by_slot[ea.ref], table._by_slot[eb.ref] = b.adapter_id, a.adapter_id
    _assert_both_refused(engine)


def test_swapped_batch_metadata_is_caught_by_the_canary_markers(canaries, monkeypatch) -> None:
    """A bug below the engine's check (the per-token slot index) gets past admission; the markers show it."""
    engine, _, manifest, a, b, first = _two_running(canaries)
    real = model_runner.build_batch_meta

    def swapped(rows, device, segmented=False) -> LoraBatchMeta | None:
        return real(list(reversed(rows)), device, segmented)  # two decode rows: each gets the other's slot

    monkeypatch.setattr(model_runner, "build_batch_meta", swapped)
    tokens = {k: list(v) for k, v in first.items()}
    while engine.has_work():
        for o in engine.step():
            tokens[o.request_id].append(o.token_id)
    tally = IsolationTally()
    for rid, adapter in (("ra", a.adapter_id), ("rb", b.adapter_id)):
        tally.record(rid, adapter, markers_in_tokens(tokens[rid], manifest.markers()))
    assert tally.missing_marker == 2 and not tally.ok()
