"""The calibrated stand-in's model: tokens at the timing model's step boundaries, the tier each request
found its adapter in, LRU eviction from the GPU slots, and the placement commands."""

from __future__ import annotations

import heapq
import itertools

import pytest

from bench.standin_host import HostConfig, HostedStandin
from bench.standin_model import ModeledReplica
from sim.replica import CacheSizes
from sim.timing import TimingModel

ADAPTER_BYTES = 100


class Recorder:
    def __init__(self, clock: list[float]) -> None:
        self.clock = clock
        self.tokens: list[tuple[int, float]] = []
        self.finished_at: float | None = None

    def token(self, index: int) -> None:
        self.tokens.append((index, self.clock[0]))

    def done(self) -> None:
        self.finished_at = self.clock[0]


class Driver:
    """A heap of model-time events, run to the end."""

    def __init__(self, slots: int = 2, ram_adapters: int = 3) -> None:
        self.events: list[tuple[float, int, int, object]] = []
        self.seq = itertools.count()
        self.clock = [0.0]
        sizes = CacheSizes(
            gpu_slots=slots,
            adapter_bytes=ADAPTER_BYTES,
            ram_bytes=ram_adapters * ADAPTER_BYTES,
            disk_bytes=10**6,
        )
        self.replica = ModeledReplica("r0", TimingModel(), sizes, self.schedule)

    def schedule(self, t: float, kind: int, payload: object) -> None:
        heapq.heappush(self.events, (t, next(self.seq), kind, payload))

    def submit(self, adapter_id: str, prompt: int = 800, output: int = 4) -> tuple[str, Recorder]:
        sink = Recorder(self.clock)
        return self.replica.submit(adapter_id, prompt, output, self.clock[0], sink), sink

    def run(self) -> None:
        while self.events:
            t, _, kind, payload = heapq.heappop(self.events)
            self.clock[0] = t
            self.replica.dispatch(kind, payload, t)


def test_tokens_follow_the_timing_models_steps_after_a_load_from_the_object_store() -> None:
    d = Driver()
    tier, sink = d.submit("a", prompt=800, output=4)
    d.run()
    timing = TimingModel()
    assert tier == "remote"
    first = timing.load_s["remote"] + timing.step_s(1, 1) + timing.prefill_s(800)
    assert [i for i, _ in sink.tokens] == [0, 1, 2, 3]
    assert sink.tokens[0][1] == pytest.approx(first)
    gaps = [b - a for (_, a), (_, b) in itertools.pairwise(sink.tokens)]
    assert gaps == pytest.approx([timing.step_s(1, 1)] * 3)
    assert sink.finished_at == sink.tokens[-1][1]


def test_a_second_request_finds_its_adapter_on_the_gpu() -> None:
    d = Driver()
    d.submit("a")
    d.run()
    tier, sink = d.submit("a", prompt=0, output=2)
    d.run()
    assert tier == "gpu" and len(sink.tokens) == 2 and d.replica.found == {"remote": 1, "gpu": 1}


def test_the_least_recently_used_idle_adapter_leaves_the_gpu_for_ram() -> None:
    d = Driver(slots=2)
    for aid in ("a", "b", "a", "c"):  # c takes b's slot: a was used after b
        d.submit(aid)
        d.run()
    state = d.replica.cache_state(d.clock[0])
    assert sorted(state.gpu_adapters) == ["a", "c"] and "b" in state.ram_adapters
    assert d.replica.tier_of("b") == "ram"
    assert d.submit("b")[0] == "ram"


def test_a_batch_is_capped_at_the_models_max_batch() -> None:
    d = Driver()
    d.submit("a", output=1)
    d.run()
    sinks = [d.submit("a", prompt=0, output=1)[1] for _ in range(TimingModel().max_batch + 1)]
    d.run()
    firsts = sorted(s.tokens[0][1] for s in sinks)
    assert firsts[-2] == firsts[0] < firsts[-1]  # the one past the cap waits for the next step


def test_load_and_unload_commands_move_adapters_between_tiers() -> None:
    d = Driver()
    assert d.replica.own("a", "ram", 0.0) == "ram"
    d.replica.own("b", "gpu", 0.0)
    d.run()
    assert d.replica.tier_of("b") == "gpu" and d.submit("a")[0] == "ram"
    d.run()
    assert d.replica.unload("a", d.clock[0]) is True and d.replica.tier_of("a") == "remote"


def test_in_flight_tokens_and_queue_are_reported_while_requests_run() -> None:
    """As a real replica counts them: each request's prompt and the tokens it has so far. A count of the
    tokens still to come would hide a queue of long prompts from the gateways' routing."""
    d = Driver()
    d.submit("a", prompt=40, output=5)
    assert d.replica.queue_depth() == 1 and d.replica.tokens_in_flight() == 40
    # the batch the router reads: no row yet, its prompt ahead of any new request
    assert (d.replica.running(), d.replica.prefill_tokens(), d.replica.max_running()) == (0, 40, 32)
    while d.events and not d.replica.sim.finishing:
        t, _, kind, payload = heapq.heappop(d.events)
        d.clock[0] = t
        d.replica.dispatch(kind, payload, t)
    assert d.replica.queue_depth() == 0 and d.replica.tokens_in_flight() == 40  # its first token is to come
    assert (d.replica.running(), d.replica.prefill_tokens()) == (1, 0)  # its step prefills it
    assert d.replica.model_ttfts == []
    t, _, kind, payload = heapq.heappop(d.events)
    d.clock[0] = t
    d.replica.dispatch(kind, payload, t)
    assert d.replica.tokens_in_flight() == 41
    assert d.replica.model_ttfts == [(0.0, t)]  # arrived at 0, its first token at the end of its step


def test_a_request_whose_caller_went_away_frees_its_place_as_on_a_replica() -> None:
    """A gateway that gives up on a first token closes the connection and tries elsewhere. A replica then
    frees the request's row; a stand-in that ran it on would serve every retried request twice."""
    d = Driver()
    d.replica.own("a", "gpu", 0.0)
    d.run()
    _, running = d.submit("a", prompt=40, output=50)
    _, queued = d.submit("a", prompt=40, output=50)
    d.replica.cancel(queued)  # before any step: it never runs
    t, _, kind, payload = heapq.heappop(d.events)
    d.clock[0] = t
    d.replica.dispatch(kind, payload, t)  # the running one is admitted
    assert len(d.replica.sim.finishing) == 1 and d.replica.tokens_in_flight() == 40
    for _ in range(3):
        t, _, kind, payload = heapq.heappop(d.events)
        d.clock[0] = t
        d.replica.dispatch(kind, payload, t)
    assert [i for i, _ in running.tokens] == [0, 1, 2]
    d.replica.cancel(running)
    d.run()
    assert len(running.tokens) <= 4 and running.finished_at is None and queued.tokens == []
    assert d.replica.tokens_in_flight() == 0 and not d.replica.sim.rows and d.replica.served == 0
    assert all(e.ref_count == 0 for e in d.replica.sim.slots.entries())


async def test_a_hosted_standin_reports_its_batch_in_replica_state() -> None:
    """What the gateways' routers read: the queue, the rows in use, the batch size and the prompts ahead."""
    sizes = CacheSizes(gpu_slots=2, adapter_bytes=ADAPTER_BYTES, ram_bytes=1_000, disk_bytes=1_000)
    config = HostConfig(("r-0",), (1,), "token", TimingModel(), sizes, slow=1_000.0)
    standin = HostedStandin("r-0", "http://127.0.0.1:1", config)
    standin.model.submit("a", 500, 3, standin.now(), Recorder([0.0]))
    standin.model.submit("b", 700, 3, standin.now(), Recorder([0.0]))
    state = standin.replica_state()
    assert (state.queue_depth, state.running, state.max_running, state.prefill_tokens) == (2, 0, 32, 1_200)
