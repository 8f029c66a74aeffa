"""A modeled GPU replica for the calibrated stand-in: the simulator's replica (sim/replica.py: GPU slots,
RAM and disk tiers with LRU eviction, their load times, continuous batching on sim.timing's model) with each
request's tokens handed to a sink at the step boundaries that produce them.

Pure logic: time is whatever the caller's schedule says. The stand-in host maps it to the event loop's clock
with a slow-down factor; the tests pop a heap. A request admitted at boundary k gets its first token at
boundary k+1 and its last (with the done call) at boundary k + output tokens, as in the simulator.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable
from typing import Protocol, cast

from replica.adapter_cache.cache import CacheState
from replica.adapter_cache.tier import Tier
from sim.replica import FETCHED, LOAD_DONE, STEP, CacheSizes, SimReplica, SimRequest
from sim.timing import TimingModel
from sim.workload import Request

Schedule = Callable[[float, int, object], None]  # (model time, event kind, payload)


class Sink(Protocol):
    """Where one request's tokens go."""

    def token(self, index: int) -> None: ...

    def done(self) -> None: ...


class ModeledReplica:
    """One replica's timing and tiers; call dispatch() for each event its schedule fires."""

    def __init__(self, replica_id: str, timing: TimingModel, sizes: CacheSizes, schedule: Schedule) -> None:
        self.replica_id = replica_id
        self.sim = SimReplica(replica_id, timing, sizes, schedule, self._complete)
        self.sinks: dict[int, tuple[Sink, int]] = {}  # request id -> its sink and tokens sent so far
        self.requests: dict[int, SimRequest] = {}  # request id -> the request, until it completes
        self.ids = itertools.count()
        self.found: dict[str, int] = {}  # tier -> requests that found their adapter there
        self.served = 0
        self.load_marks: deque[tuple[float, int]] = deque()  # (model time, GPU loads so far) at each report
        # (arrival, time from it to the step end that gives its first token) of each request, on the model's
        # own schedule: the host's time to first token less however late its loop ran that step's callback
        self.model_ttfts: list[tuple[float, float]] = []

    # requests

    def submit(self, adapter_id: str, prompt_tokens: int, output_tokens: int, now: float, sink: Sink) -> Tier:
        """Queue a request; the tier its adapter was found in (a load from there starts now)."""
        req = Request(next(self.ids), now, adapter_id, prompt_tokens, max(output_tokens, 1))
        sr = SimRequest(req)
        self.sinks[req.request_id] = (sink, 0)
        self.requests[req.request_id] = sr
        self.sim.arrive(sr, now)
        tier = cast(Tier, sr.found_in)
        self.found[tier] = self.found.get(tier, 0) + 1
        return tier

    def cancel(self, sink: Sink) -> None:
        """The caller went away: as a replica does, the request leaves the queue or frees its batch row at
        the next step boundary, and sends nothing more."""
        for key, (s, sent) in list(self.sinks.items()):
            if s is sink:
                self.sinks[key] = (_DROPPED, sent)
                self.sim.cancel(self.requests[key])

    def dispatch(self, kind: int, payload: object, now: float) -> None:
        """One event the schedule fired, at model time now."""
        if kind == STEP:
            self._tokens(now)
            cast(SimReplica, payload).step(now)
        elif kind == LOAD_DONE:
            self.sim.load_done(cast(tuple[SimReplica, str], payload)[1], now)
        elif kind == FETCHED:
            self.sim.fetched(cast(tuple[SimReplica, str], payload)[1], now)

    def _tokens(self, now: float) -> None:
        """A step ended at model time now: every request running in it gets its next token."""
        for _, _, sr in self.sim.finishing:
            key = sr.req.request_id
            sink, sent = self.sinks[key]
            if sent == 0 and sink is not _DROPPED:
                self.model_ttfts.append((sr.req.arrival_s, now - sr.req.arrival_s))
            sink.token(sent)
            self.sinks[key] = (sink, sent + 1)

    def _complete(self, sr: SimRequest) -> None:
        sink, _ = self.sinks.pop(sr.req.request_id)
        del self.requests[sr.req.request_id]
        if sr.cancelled:
            return
        self.served += 1
        sink.done()

    # what the replica reports

    def tokens_in_flight(self) -> int:
        """What a real replica reports (replica/engine/scheduler.py): every running and waiting request's
        length so far, its prompt included."""
        step = self.sim.step_no
        running = sum(  # a request in the running step (admitted at step_no - 1) has its token at step_no
            sr.req.prompt_tokens + sr.req.output_tokens - (sr.finish_step - step + 1)
            for _, _, sr in self.sim.finishing
        )
        return running + self.prefill_tokens()

    def queue_depth(self) -> int:
        """Requests admitted to no batch yet: ready ones and those waiting for their adapter's load."""
        return self.sim.batch().waiting

    def running(self) -> int:
        """Rows of the batch in use: the requests admitted to a step and not yet finished."""
        return self.sim.batch().running

    def max_running(self) -> int:
        return self.sim.timing.max_batch

    def prefill_tokens(self) -> int:
        """Prompt tokens not yet prefilled: those of the requests admitted to no batch yet (the running
        step prefills its own admissions whole)."""
        return self.sim.batch().prefill_tokens

    def cache_state(self, now: float) -> CacheState:
        """The tiers as a replica's cache reports them (an adapter still being written is not on the GPU),
        with GPU loads over the last model minute."""
        gpu = sorted(set(self.sim.slots.adapter_ids()).difference(self.sim.loading))
        self.load_marks.append((now, sum(self.sim.loads.values())))
        while len(self.load_marks) > 1 and self.load_marks[1][0] <= now - 60.0:
            self.load_marks.popleft()
        loads = float(self.load_marks[-1][1] - self.load_marks[0][1])
        return CacheState(gpu, self.sim.ram.keys(), self.sim.disk.keys(), 0.0, loads)

    def contents(self) -> dict[str, list[str]]:
        """The GPU slots, least recently used first, and RAM: how the simulator's replica starts
        (sim.simulator.SimConfig.initial) when it is compared from the same moment."""
        entries = sorted(self.sim.slots.entries(), key=lambda e: (e.last_used, e.seq))
        gpu = [e.adapter_id for e in entries if e.adapter_id not in self.sim.loading]
        return {"gpu": gpu, "ram": list(self.sim.ram.keys())}

    def tier_of(self, adapter_id: str) -> Tier:
        return cast(Tier, self.sim.tier_of(adapter_id))

    # replica.commands

    def own(self, adapter_id: str, target: Tier, now: float) -> Tier:
        """A load or prewarm command: owned on disk and in RAM, and in a slot when the target is the GPU."""
        self.sim.command(adapter_id, "load", target, now)
        return self.tier_of(adapter_id)

    def unload(self, adapter_id: str, now: float) -> bool:
        """An unload command: dropped everywhere unless a request is using it (the next plan retries)."""
        self.sim.command(adapter_id, "unload", "", now)
        return self.tier_of(adapter_id) == "remote"


class _Dropped:
    def token(self, index: int) -> None:
        pass

    def done(self) -> None:
        pass


_DROPPED = _Dropped()
