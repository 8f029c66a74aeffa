"""Tenant isolation on a replica: 64 canaries, fewer slots than adapters, 10,000 mixed requests, zero leaks.

Each canary answers any prompt with its own marker, so the marker in a row's output names the weights
that produced it. Requests take the replica's own path (the adapter cache's slot writes and LRU evictions
on the event loop, the engine thread's admission and mixed-rank batches with base-only rows), and a
deliberately broken slot mapping must be caught.
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import httpx
import jsonschema
import pytest

import replica.engine.model_runner as model_runner
from canary.check import IsolationTally
from canary.churn import ChurnConfig, churn_ok, churn_requests, churn_settings, run_churn
from canary.manifest import CanaryManifest
from canary.markers import markers_in_tokens
from canary.prompts import SharedPrefixSampler
from replica.adapter_cache.disk import ENTRY_RE
from replica.adapter_cache.object_store import Fetched
from replica.adapter_cache.record import AdapterRecord
from replica.engine.decode_staging import DecodeStaging
from replica.engine.decode_step import DecodeRow, DecodeStep, PreparedBatch
from replica.engine.sampler import SamplingParams
from replica.lora.batch_meta import LoraBatchMeta
from replica.runtime import Replica, build_replica
from replica.server import create_app
from tests.canary.canary_util import (
    build_canary_engine,
    canary_replica,
    tiny_sampler,
    train_tiny_canaries,
    with_byte_tokenizer,
)
from tests.canary.engine_run import mixed_requests, run_isolation
from tests.replica.generate_util import generate

NUM_CANARIES = 64
SLOTS = {8: 4, 16: 4, 32: 4}  # 12 GPU slots for 64 adapters: loads and evictions all through the run
CHURN_REQUESTS = 400
DISK_LOSS_REQUESTS = 200  # the CI run; `python -m bench.isolation --requests 10000` is the long one
CONSTRAINED_REQUESTS = 800


@pytest.fixture(scope="module")
def canaries(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, CanaryManifest]:
    return train_tiny_canaries(tmp_path_factory.mktemp("canaries"), NUM_CANARIES)


async def test_10000_mixed_requests_carry_only_their_own_marker(
    canaries: tuple[Path, Path, CanaryManifest], tmp_path: Path
) -> None:
    base, out, manifest = canaries
    replica = canary_replica(base, out, manifest, SLOTS, max_num_seqs=64, cache_dir=tmp_path)
    ids = [e.adapter_id for e in manifest.adapters]
    assert sorted({e.rank for e in manifest.adapters}) == [8, 16, 32]
    await replica.start()
    try:
        assert replica.cache is not None and replica.gpu is not None
        staging = _stage_ahead_as_on_a_gpu(replica)
        start = time.perf_counter()
        # half the prompts start with one of four shared 8-token blocks: blocks are hit and evicted
        # all through the run, each adapter's only by its own requests
        prompts = SharedPrefixSampler(tiny_sampler(), prefixes=4, share=0.5)
        requests = mixed_requests(10_000, ids, prompts, seed=0, base_fraction=0.2)
        tally, stats = await run_isolation(replica, requests, manifest.markers(), max_new_tokens=3)
        wall_s = time.perf_counter() - start
        cache, table = replica.cache, replica.gpu.table
        blocks, counters = replica.engine.engine.blocks, replica.engine.engine.scheduler.counters
        summary = tally.summary() | {
            "wall_s": round(wall_s, 2),
            "max_batch": stats.max_batch,
            "slot_loads": cache.gpu_loads.total,
            "evictions": cache.gpu_evictions.total,
            "gpu_slots": sum(SLOTS.values()),
            "adapters": NUM_CANARIES,
            "prefix_hit_tokens": counters.hits,
            "kv_block_evictions": blocks.evictions,
            "kv_blocks": blocks.num_blocks,
            "staged_ahead": dict(staging.counts),
        }
        print(json.dumps(summary))
        assert tally.requests == 10_000 and tally.base_requests > 1000 and tally.errors == 0, summary[
            "findings"
        ]
        assert tally.wrong_marker == 0 and tally.base_with_marker == 0, summary["findings"]
        assert tally.missing_marker == 0, summary["findings"]
        assert cache.gpu_evictions.total > 0 and table.evictions == cache.gpu_evictions.total
        assert stats.max_batch > 32
        assert all(e.ref_count == 0 for e in table.entries())  # every pin was released
        assert counters.hits > 10_000 and blocks.evictions > 1000  # hits and evictions under churn
        blocks.check()
        assert blocks.num_free == blocks.num_blocks and not blocks.tables  # every block free or cached
        assert cache.state().ram_adapters == sorted(ids)  # every canary came in and stays in host RAM
        # how often two steps in a row decode the same rows depends on arrival timing (94 and over 100 in
        # two local runs): the staging ahead was taken up, and rebuilt rows, at least once
        assert staging.counts["ahead_used"] > 0 and staging.counts["rows_rebuilt"] > 0
    finally:
        await replica.stop()


def _stage_ahead_as_on_a_gpu(replica: Replica) -> DecodeStaging:
    """Run the engine as it runs on CUDA: the next decode step staged while this one runs, through a device
    buffer apart from the two host buffers."""
    core = replica.engine.engine
    step = core.runner.decode
    step.staging = DecodeStaging(
        step.max_rows, step.width, step.block_size, step.sink_block, step.device, separate=True
    )
    core.prepare_ahead = True
    return step.staging


# Small schemas the tiny base can finish within a few dozen byte tokens, different per row.
SCHEMAS = [
    {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["n"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "tag": {"enum": ["a", "bb"]}},
        "required": ["ok", "tag"],
        "additionalProperties": False,
    },
    {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 1, "maxItems": 3},
]


async def test_constrained_rows_in_the_mix_follow_their_grammars_and_leave_every_marker(
    canaries: tuple[Path, Path, CanaryManifest], tmp_path: Path
) -> None:
    base, out, manifest = canaries
    tokenized = with_byte_tokenizer(base, tmp_path / "base")
    replica = canary_replica(tokenized, out, manifest, SLOTS, max_num_seqs=64, cache_dir=tmp_path / "cache")
    ids = [e.adapter_id for e in manifest.adapters]
    await replica.start()
    try:
        assert replica.grammars is not None and replica.tokenizer is not None
        requests = mixed_requests(
            CONSTRAINED_REQUESTS, ids, tiny_sampler(), seed=5, schemas=SCHEMAS, constrained_fraction=0.25
        )
        tally, stats = await run_isolation(
            replica, requests, manifest.markers(), max_new_tokens=3, constrained_max_tokens=30
        )
        findings = tally.summary()["findings"]
        assert tally.errors == 0 and tally.wrong_marker == 0 and tally.base_with_marker == 0, findings
        assert tally.missing_marker == 0, findings
        assert len(stats.constrained) > CONSTRAINED_REQUESTS // 8 and stats.max_batch > 32
        assert {json.dumps(schema) for schema, _ in stats.constrained.values()} == {
            json.dumps(s) for s in SCHEMAS
        }
        for schema, tokens in stats.constrained.values():
            jsonschema.validate(json.loads(replica.tokenizer.decode(tokens)), schema)
        blocks = replica.engine.engine.blocks
        assert blocks.num_free == blocks.num_blocks and not blocks.tables
    finally:
        await replica.stop()


async def _two_running(canaries: tuple[Path, Path, CanaryManifest], cache_dir: Path):
    """An engine with two canaries of the same rank bucket admitted and past their prefill."""
    base, out, manifest = canaries
    served = build_canary_engine(base, out, manifest, SLOTS, max_num_seqs=8, cache_dir=cache_dir)
    a, b = manifest.adapters[0], manifest.adapters[3]  # both rank 8
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    prompt = tiny_sampler().sample(random.Random(1))
    await served.add("ra", prompt, params, a.adapter_id)
    await served.add("rb", prompt, params, b.adapter_id)
    first = {o.request_id: [o.token_id] for o in served.step()}
    return served, manifest, a, b, first


def _assert_both_refused(served) -> None:
    """Each mismatched row ends with a slot_mismatch error and no token; nothing ran on the wrong weights."""
    outs = {o.request_id: o for o in served.step()}
    assert set(outs) == {"ra", "rb"}
    for o in outs.values():
        assert o.finished and o.finish_reason == "error" and o.token_id is None
        assert o.error.startswith("slot_mismatch")
    assert not served.engine.has_work() and not served.leases


async def test_swapped_row_slots_are_refused_before_the_forward_pass(canaries, tmp_path: Path) -> None:
    served, _, _, _, _ = await _two_running(canaries, tmp_path)
    sa, sb = served.engine.seqs["ra"], served.engine.seqs["rb"]
    assert sa.slot != sb.slot
    sa.slot, sb.slot = sb.slot, sa.slot  # a bug in the row -> slot mapping after admission
    _assert_both_refused(served)


async def test_corrupted_slot_table_is_refused_before_the_forward_pass(canaries, tmp_path: Path) -> None:
    served, _, a, b, _ = await _two_running(canaries, tmp_path)
    table = served.cache.gpu.table
    ea, eb = table.lookup(a.adapter_id), table.lookup(b.adapter_id)
    # the table now claims each slot holds the other adapter (the rows keep the slots they were pinned to)
    table._by_slot[ea.ref], table._by_slot[eb.ref] = b.adapter_id, a.adapter_id
    _assert_both_refused(served)


async def test_swapped_batch_metadata_is_caught_by_the_canary_markers(
    canaries, tmp_path: Path, monkeypatch
) -> None:
    """A bug below the engine's check (the per-token slot index) gets past admission; the markers show it."""
    served, manifest, a, b, first = await _two_running(canaries, tmp_path)
    real = model_runner.build_batch_meta

    def swapped(rows, device, segmented=False) -> LoraBatchMeta | None:
        return real(list(reversed(rows)), device, segmented)  # two decode rows: each gets the other's slot

    real_prepare = DecodeStep.prepare

    def swapped_decode(step: DecodeStep, rows: list[DecodeRow]) -> PreparedBatch:
        slots = [r.slot for r in reversed(rows)]  # the decode step's per-row slots, swapped the same way
        return real_prepare(step, [replace(r, slot=s) for r, s in zip(rows, slots, strict=True)])

    monkeypatch.setattr(model_runner, "build_batch_meta", swapped)
    monkeypatch.setattr(DecodeStep, "prepare", swapped_decode)
    tokens = {k: list(v) for k, v in first.items()}
    while served.engine.has_work():
        for o in served.step():
            tokens[o.request_id].append(o.token_id)
    tally = IsolationTally()
    for rid, adapter in (("ra", a.adapter_id), ("rb", b.adapter_id)):
        tally.record(rid, adapter, markers_in_tokens(tokens[rid], manifest.markers()))
    assert tally.missing_marker == 2 and not tally.ok()


async def test_churn_through_the_replica_app_keeps_every_marker_and_releases_every_pin(
    canaries: tuple[Path, Path, CanaryManifest], tmp_path: Path
) -> None:
    """The production path under churn: 64 canaries, 2 GPU slots per rank bucket, host RAM for about 6,
    requests through the replica's generate route, 64 at a time. Slots are evicted and written all through
    the run, some from disk reads on worker threads while the engine thread decodes other rows."""
    base, out, manifest = canaries
    cfg = ChurnConfig(requests=CHURN_REQUESTS, concurrency=64, slots_per_bucket=2, ram_adapters=6)
    replica = build_replica(churn_settings(base, out, manifest, cfg, tmp_path))
    summary = await run_churn(replica, cfg, manifest.markers())
    print(json.dumps(summary))
    assert summary["requests"] == CHURN_REQUESTS and summary["errors"] == 0, summary["findings"]
    assert summary["wrong_marker"] == 0 and summary["base_with_marker"] == 0, summary["findings"]
    assert summary["missing_marker"] == 0, summary["findings"]  # no adapter request answered by the base
    assert summary["leftover_pins"] == dict.fromkeys(summary["leftover_pins"], 0)
    assert churn_ok(summary)
    writes = summary["slot_writes"]
    assert summary["gpu_evictions"] > CHURN_REQUESTS // 4 and summary["ram_evictions"] > 0
    assert writes["off_loop"] > 0 and writes["during_decode"] > 0  # slot writes raced decoding


async def test_disk_entries_deleted_under_churn_are_fetched_again_and_every_request_is_served(
    canaries: tuple[Path, Path, CanaryManifest], tmp_path: Path
) -> None:
    """Canaries cycle through one GPU slot per rank bucket and a host RAM of about two, so most requests
    reload an adapter from the disk tier, while an operator's cleanup deletes every entry folder it finds.
    A reload that finds its files gone fetches and re-verifies the adapter from the object store: no
    request fails (no FileNotFoundError reaches a client) and each answer carries its own marker."""
    base, out, manifest = canaries
    cfg = ChurnConfig(requests=DISK_LOSS_REQUESTS, concurrency=16, slots_per_bucket=1, ram_adapters=2)
    replica = build_replica(churn_settings(base, out, manifest, cfg, tmp_path / "cache"))
    cache_dir = replica.settings.cache_path()
    deleted: list[str] = []
    churning = asyncio.Event()

    async def operator_cleanup() -> None:
        while not churning.is_set():
            for entry in list(cache_dir.iterdir()) if cache_dir.is_dir() else []:
                if ENTRY_RE.fullmatch(entry.name):
                    shutil.rmtree(entry, ignore_errors=True)
                    deleted.append(entry.name)
            await asyncio.sleep(0.02)  # pacing of the fault, not a wait for a result

    async def churn() -> dict[str, object]:
        try:
            return await run_churn(replica, cfg, manifest.markers())
        finally:
            churning.set()

    summary, _ = await asyncio.gather(churn(), operator_cleanup())
    fetched = replica.metrics.registry.get_sample_value(
        "lorafleet_replica_adapter_loads_total", {"from_tier": "remote", "to_tier": "ram"}
    )
    print(json.dumps(summary | {"deleted": len(deleted), "remote_loads": fetched}))
    assert summary["requests"] == DISK_LOSS_REQUESTS and summary["errors"] == 0, summary["findings"]
    assert summary["wrong_marker"] == 0 and summary["missing_marker"] == 0, summary["findings"]
    assert summary["leftover_pins"] == dict.fromkeys(summary["leftover_pins"], 0)
    assert deleted and int(str(summary["ram_evictions"])) > 0
    asked = {r.adapter_id for r in churn_requests(cfg, [m.adapter_id for m in manifest.markers()])} - {None}
    assert fetched is not None and fetched > len(asked)  # some came again from the object store


async def test_a_tenant_asking_for_many_cold_adapters_is_capped_while_a_hot_tenant_is_served(
    canaries: tuple[Path, Path, CanaryManifest], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the replica's app: the object store holds every download until the test releases it. One
    tenant asks for 8 distinct cold adapters (one of them 3 times): 3 loads are admitted (its cap), the
    repeats of an admitted one join its load, the rest get 429 too_many_cold_loads with Retry-After. A
    second tenant's 2 fill the replica's cap of 5, and a third tenant's cold request gets 503
    cold_loads_full. A hot tenant's requests are served while all 5 loads still wait; once released, every
    admitted request is answered with its own marker, after one fetch per digest."""
    base, out, manifest = canaries
    ids = [e.adapter_id for e in manifest.adapters]
    cfg = ChurnConfig(requests=0, slots_per_bucket=8, ram_adapters=64)
    settings = churn_settings(base, out, manifest, cfg, tmp_path).model_copy(
        update={"cold_loads_per_tenant": 3, "cold_loads_total": 5}
    )
    replica = build_replica(settings)
    app = create_app(replica)
    url = f"/internal/replicas/{settings.replica_id}/generate"
    prompts = [r.prompt_token_ids for r in churn_requests(ChurnConfig(requests=64, base_fraction=0.0), ids)]
    markers = manifest.markers()
    tally = IsolationTally()
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)  # a failure is a 500, as served
    headers = {"Authorization": f"Bearer {settings.service_token}"}
    client = httpx.AsyncClient(transport=transport, base_url="http://replica", headers=headers, timeout=300)
    async with app.router.lifespan_context(app), client:
        cache = replica.cache
        assert cache is not None
        hot = ids[0]
        status, _, tokens = await generate(client, url, hot, "hot", prompts[0])
        assert status == 200 and cache.tier_of(hot) == "gpu"

        released = asyncio.Event()
        fetches: Counter[str] = Counter()
        fetch = cache.store.fetch

        async def held_fetch(record: AdapterRecord, pin: bool = False) -> Fetched:
            fetches[record.digest] += 1
            await released.wait()
            return await fetch(record, pin)

        monkeypatch.setattr(cache.store, "fetch", held_fetch)
        storm_ids = ids[1:9] + [ids[1], ids[1]]
        storm = [
            (a, asyncio.ensure_future(generate(client, url, a, "storm", prompts[i])))
            for i, a in enumerate(storm_ids)
        ]

        async def until(pred: Callable[[], bool]) -> None:
            deadline = time.monotonic() + 120
            while not pred():
                assert time.monotonic() < deadline, (cache.cold_loads.loading(), fetches)
                await asyncio.sleep(0.02)

        def storm_settled() -> bool:
            loading = cache.cold_loads.loading()
            return len(fetches) == 3 and all(t.done() for a, t in storm if a not in loading)

        await until(storm_settled)
        admitted = set(cache.cold_loads.loading())
        assert len(admitted) == 3 and set(cache.cold_loads.loading().values()) == {"storm"}
        refused = [t.result() for a, t in storm if a not in admitted]
        assert len(refused) == len([a for a in storm_ids if a not in admitted]) >= 5
        for status, got_headers, error in refused:
            assert status == 429 and got_headers["retry-after"] == "1", (status, error)
            assert isinstance(error, dict) and error["error"]["code"] == "too_many_cold_loads"

        others = [
            asyncio.ensure_future(generate(client, url, a, "other", prompts[20 + i]))
            for i, a in enumerate(ids[10:12])
        ]
        await until(lambda: len(cache.cold_loads.loading()) == 5 and len(fetches) == 5)
        status, got_headers, error = await generate(client, url, ids[12], "third", prompts[30])
        assert status == 503 and got_headers["retry-after"] == "1"
        assert isinstance(error, dict) and error["error"]["code"] == "cold_loads_full"

        for i in range(5):  # the hot tenant, while five cold loads wait on the store
            status, _, tokens = await generate(client, url, hot, "hot", prompts[40 + i])
            assert status == 200 and isinstance(tokens, list)
            tally.record(f"hot-{i}", hot, markers_in_tokens(tokens, markers))
        assert not released.is_set() and len(cache.cold_loads.loading()) == 5

        released.set()
        waited = [(a, t) for a, t in storm if a in admitted] + list(zip(ids[10:12], others, strict=True))
        for i, (adapter_id, task) in enumerate(waited):
            status, _, tokens = await asyncio.wait_for(task, 120)
            assert status == 200 and isinstance(tokens, list), tokens
            tally.record(f"cold-{i}", adapter_id, markers_in_tokens(tokens, markers))
        joined = storm_ids.count(ids[1]) - 1 if ids[1] in admitted else 0  # the repeats joined its load
        assert len(waited) == 5 + joined
        assert tally.wrong_marker == 0 and tally.missing_marker == 0, tally.summary()["findings"]
        digests = {cache.records[a].digest for a in admitted | set(ids[10:12])}
        assert fetches == dict.fromkeys(digests, 1)  # one load per distinct digest admitted
        assert cache.cold_loads.loading() == {}


async def test_a_long_prompt_shared_by_two_canaries_reuses_blocks_only_within_one_adapter_and_salt(
    canaries: tuple[Path, Path, CanaryManifest], tmp_path: Path
) -> None:
    """Two canaries (two tenants' adapters, or two versions of one: both are distinct adapter ids) get the
    same long prompt: each answers with its own marker, and the second reuses nothing of the first's; a
    salted request reuses only blocks of its own salt."""
    base, out, manifest = canaries
    replica = canary_replica(base, out, manifest, SLOTS, max_num_seqs=8, cache_dir=tmp_path)
    prompt = SharedPrefixSampler(tiny_sampler(), prefixes=1, share=1.0).sample(random.Random(3))
    a, b = manifest.adapters[0], manifest.adapters[1]
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    markers = manifest.markers()

    async def ask(adapter_id: str, salt: str | None = None) -> tuple[list[str], int]:
        use = await replica.acquire(adapter_id)
        try:
            outs = [
                o async for o in replica.engine.generate(prompt, params, adapter_id, None, None, None, salt)
            ]
        finally:
            replica.release(use)
        tokens = [o.token_id for o in outs if o.token_id is not None]
        return sorted(markers_in_tokens(tokens, markers)), outs[-1].cached_tokens

    await replica.start()
    try:
        assert 10 <= len(prompt) <= 17  # a full 8-token block, shared, and a few more tokens
        assert await ask(a.adapter_id) == ([a.adapter_id], 0)
        assert await ask(b.adapter_id) == ([b.adapter_id], 0)  # the same tokens, the other adapter: no hit
        found_a, cached_a = await ask(a.adapter_id)
        assert found_a == [a.adapter_id] and cached_a >= 8  # its own blocks: hit
        assert await ask(a.adapter_id, salt="user-1") == ([a.adapter_id], 0)
        assert (await ask(a.adapter_id, salt="user-2"))[1] == 0
        found_salted, cached_salted = await ask(a.adapter_id, salt="user-1")
        assert found_salted == [a.adapter_id] and cached_salted >= 8
    finally:
        await replica.stop()
