"""One simulated replica: the real cache bookkeeping (SlotTable for GPU slots with refcounts, ByteLru for
host RAM and local disk) and continuous batching driven by the timing model.

A miss is a load in two parts, as in replica.adapter_cache: bringing the file to host RAM (from disk or the
object store: load_s[tier] - load_s["ram"]; loads overlap), then the slot write (load_s["ram"]), which
reserves a slot (evicting the least recently used idle adapter) and runs ONE AT A TIME per replica, as the
real GpuTier's write lock makes it. A request holds a pin on its adapter's slot from the moment the adapter
is ready until it finishes, and a load holds one while it writes the slot, so only idle adapters are
evicted (the SlotTable enforces it). Step k runs between boundaries k and k+1; a request admitted at
boundary k has its prompt prefilled in step k, emits its first token at boundary k+1 and its last at
boundary k + output_tokens.
"""

from __future__ import annotations

import heapq
import random
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from lorafleet.sizing import BRIEF, PRODUCTION
from replica.adapter_cache.lru import ByteLru
from replica.errors import NoFreeSlotError
from replica.lora.slots import SlotTable
from sim.host import SharedHost
from sim.timing import TimingModel
from sim.workload import Request


@dataclass(slots=True)
class SimRequest:
    """A request's journey through the fleet; times are simulated seconds."""

    req: Request
    replica_id: str = ""
    route_reason: str = ""
    found_in: str = ""
    first_token_s: float = -1.0
    finish_s: float = -1.0
    finish_step: int = 0
    cancelled: bool = False  # its caller went away (the calibrated stand-in; the simulator never cancels)


@dataclass(frozen=True)
class CacheSizes:
    """One replica's cache; by default the production profile's rank-16 slots and tiers (lorafleet/sizing)."""

    gpu_slots: int = PRODUCTION.lora_slots[16]
    rank: int = 16
    adapter_bytes: int = BRIEF.adapter_bytes(16)
    ram_bytes: int = PRODUCTION.ram_budget_bytes  # every owned adapter (~385 at the brief's scale) and spills
    disk_bytes: int = PRODUCTION.disk_budget_bytes


Schedule = Callable[[float, int, object], None]  # (time, event kind, payload)
STEP = 1
LOAD_DONE = 2  # a slot write finished
FETCHED = 3  # a disk or object-store read reached host RAM


class Batch(NamedTuple):
    running: int
    waiting: int
    prefill_tokens: int


class SimReplica:
    """GPU slots, RAM and disk tiers, a load path per tier, and a running batch."""

    def __init__(
        self,
        replica_id: str,
        timing: TimingModel,
        sizes: CacheSizes,
        schedule: Schedule,
        on_complete: Callable[[SimRequest], None],
        seed: int = 0,
    ) -> None:
        self.replica_id = replica_id
        self.rng = random.Random(f"{seed}:{replica_id}")  # step-time jitter, when the timing has some
        self.timing, self.sizes = timing, sizes
        self.schedule, self.on_complete = schedule, on_complete
        self.slots = SlotTable({sizes.rank: sizes.gpu_slots})
        self.ram: ByteLru[str] = ByteLru(sizes.ram_bytes, "ram")
        self.disk: ByteLru[str] = ByteLru(sizes.disk_bytes, "disk")
        self.loading: dict[str, list[SimRequest]] = {}  # adapter -> requests waiting for its slot write
        self.loading_from: dict[str, str] = {}
        self.fetching: set[str] = set()  # loads still reading from disk or the object store
        self.blocked: deque[str] = deque()  # loads waiting for a slot (every slot pinned)
        self.writes: deque[str] = deque()  # loads holding a reserved slot, waiting for the one writer
        self.writing: str | None = None
        self.ready: deque[SimRequest] = deque()
        self.finishing: list[tuple[int, int, SimRequest]] = []
        self.rows: Counter[str] = Counter()  # adapter -> running rows
        self.step_no = 0
        self.cache_version = 0  # bumped whenever the GPU or RAM contents change (the router's view is cached)
        self.busy = False
        self.busy_since = 0.0
        self.host: SharedHost | None = None  # set when replicas share one machine's compute
        self.in_step: list[SimRequest] = []  # admitted in the running step (shared host: end not known yet)
        self.step_start = 0.0
        self.step_batch = 0
        self.busy_s = 0.0
        self.row_s = 0.0  # sum over steps of batch size x step time (mean batch = row_s / duration)
        self.loads: Counter[str] = Counter()  # source tier -> GPU loads
        self.ram_evictions = 0
        self.disk_evictions = 0

    # placement (before the run)

    def own(self, adapter_id: str) -> None:
        """An owner pulls the adapter to local disk and host RAM."""
        self.disk_evictions += len(self.disk.add(adapter_id, self.sizes.adapter_bytes))
        self.ram_evictions += len(self.ram.add(adapter_id, self.sizes.adapter_bytes))

    def prewarm(self, adapter_id: str, now: float) -> None:
        """Put an owned adapter with steady traffic into a free GPU slot (no eviction)."""
        if self.slots.lookup(adapter_id) is None and len(self.slots) < self.sizes.gpu_slots:
            self.slots.place(adapter_id, self.sizes.rank, now)

    def start_with(self, gpu: list[str], ram: list[str]) -> None:
        """The cache a real replica reported before the run (least recently used first)."""
        for adapter_id in ram:
            self.ram_evictions += len(self.ram.add(adapter_id, self.sizes.adapter_bytes))
        for i, adapter_id in enumerate(gpu):
            if self.slots.lookup(adapter_id) is None and len(self.slots) < self.sizes.gpu_slots:
                self.slots.place(adapter_id, self.sizes.rank, -1.0 + i * 1e-6)

    def command(self, adapter_id: str, command: str, tier: str, now: float) -> None:
        """A placement worker's command: load (own; at tier gpu, into a slot, evicting an idle adapter)
        or unload (drop it everywhere when idle), as replica.control applies them."""
        if command == "unload":
            entry = self.slots.lookup(adapter_id)
            if adapter_id in self.loading or (entry is not None and entry.ref_count):
                return  # the real replica drains first; the next plan retries
            if entry is not None:
                self.slots.remove(adapter_id)
            for tier_ in (self.ram, self.disk):
                if adapter_id in tier_:
                    tier_.remove(adapter_id)
            self.cache_version += 1
            return
        if self.tier_of(adapter_id) in ("disk", "remote"):
            self.own(adapter_id)
            self.cache_version += 1
        if tier == "gpu" and adapter_id not in self.loading and self.slots.lookup(adapter_id) is None:
            self.loading[adapter_id] = []
            self.loading_from[adapter_id] = "ram"
            self._reserve(adapter_id, now)

    # what the router sees

    def state(self) -> tuple[frozenset[str], frozenset[str]]:
        """(resident: GPU or RAM, gpu): the adapter lists of the replica's state report."""
        gpu = frozenset(self.slots.adapter_ids()).difference(self.loading)
        return gpu.union(self.ram.keys()), gpu

    # requests

    def tier_of(self, adapter_id: str) -> str:
        if self.slots.lookup(adapter_id) is not None:
            return "gpu"
        if adapter_id in self.ram:
            return "ram"
        return "disk" if adapter_id in self.disk else "remote"

    def batch(self) -> Batch:
        """What a replica reports of its batch (schemas.events.ReplicaStateBody): the rows in use, the
        requests admitted to none yet (ready, or waiting for their adapter's load) and their prompt
        tokens, the only ones not prefilled (a step prefills its own admissions whole)."""
        waiting = [*self.ready, *(sr for w in self.loading.values() for sr in w)]
        return Batch(len(self.finishing), len(waiting), sum(sr.req.prompt_tokens for sr in waiting))

    def cancel(self, sr: SimRequest) -> None:
        """Its caller went away, and a replica frees the row of a request whose connection closed: a queued
        one never runs (dropped when it would be admitted); a running one ends at the next step boundary."""
        sr.cancelled = True
        if any(entry[2] is sr for entry in self.finishing):
            sr.finish_step = self.step_no
            self.finishing[:] = [(e[2].finish_step, e[1], e[2]) for e in self.finishing]
            heapq.heapify(self.finishing)

    def arrive(self, sr: SimRequest, now: float) -> None:
        aid = sr.req.adapter_id
        sr.replica_id = self.replica_id
        if aid in self.loading:
            sr.found_in = self.loading_from[aid]
            self.loading[aid].append(sr)
            return
        sr.found_in = self.tier_of(aid)
        if sr.found_in == "gpu":
            self.slots.pin(aid, now)
            if aid in self.ram:
                self.ram.touch(aid)
            self.ready.append(sr)
            self._kick(now)
            return
        self.loading[aid] = [sr]
        self.loading_from[aid] = sr.found_in
        if sr.found_in == "ram":
            self._reserve(aid, now)
            return
        self.fetching.add(aid)
        fetch_s = max(self.timing.load_s[sr.found_in] - self.timing.load_s["ram"], 0.0)
        self.schedule(now + fetch_s, FETCHED, (self, aid))

    def fetched(self, aid: str, now: float) -> None:
        """The file is in host RAM (and on disk, from the object store): now it wants a slot."""
        self.fetching.discard(aid)
        if self.loading_from[aid] == "remote":
            self.disk_evictions += len(self.disk.add(aid, self.sizes.adapter_bytes))
        if aid in self.ram:
            self.ram.touch(aid)
        else:
            self.ram_evictions += len(self.ram.add(aid, self.sizes.adapter_bytes))
        self.cache_version += 1
        self._reserve(aid, now)

    def _reserve(self, aid: str, now: float) -> None:
        try:
            self.slots.place(aid, self.sizes.rank, now)
        except NoFreeSlotError:
            self.blocked.append(aid)
            return
        self.slots.pin(aid, now)  # the slot write's own hold
        self.cache_version += 1
        self.loads[self.loading_from[aid]] += 1
        if aid in self.ram:
            self.ram.touch(aid)
        self.writes.append(aid)
        self._next_write(now)

    def _next_write(self, now: float) -> None:
        if self.writing is None and self.writes:
            self.writing = self.writes.popleft()
            self.schedule(now + self.timing.load_s["ram"], LOAD_DONE, (self, self.writing))

    def load_done(self, aid: str, now: float) -> None:
        self.writing = None
        for sr in self.loading.pop(aid):
            self.slots.pin(aid, now)
            self.ready.append(sr)
        del self.loading_from[aid]
        self.cache_version += 1
        self.slots.unpin(aid, now)
        self._next_write(now)
        self._kick(now)

    def _unblock(self, now: float) -> None:
        while self.blocked and self.slots.can_place(self.sizes.rank):
            self._reserve(self.blocked.popleft(), now)

    def _kick(self, now: float) -> None:
        if not self.busy:
            self.busy, self.busy_since = True, now
            self.schedule(now, STEP, self)

    def step(self, now: float) -> None:
        """A step boundary: finish requests, admit ready ones, schedule the next boundary."""
        if self.host is not None:
            for sr in self.in_step:
                sr.first_token_s = now
            self.row_s += self.step_batch * (now - self.step_start)
            self.in_step, self.step_batch = [], 0
        finishing = self.finishing
        while finishing and finishing[0][0] <= self.step_no:
            sr = heapq.heappop(finishing)[2]
            aid = sr.req.adapter_id
            self.rows[aid] -= 1
            if not self.rows[aid]:
                del self.rows[aid]
            self.slots.unpin(aid, now)
            sr.finish_s = now
            self.on_complete(sr)
        if self.blocked:
            self._unblock(now)
        admitted: list[SimRequest] = []
        room = self.timing.max_batch - len(finishing)
        while self.ready and room > 0:
            sr = self.ready.popleft()
            if sr.cancelled:  # never admitted: its pin goes, and it ends with nothing sent
                self.slots.unpin(sr.req.adapter_id, now)
                sr.finish_s = now
                self.on_complete(sr)
                continue
            admitted.append(sr)
            room -= 1
        if not finishing and not admitted:
            self.busy = False
            self.busy_s += now - self.busy_since
            return
        prompt = 0
        for sr in admitted:
            self.rows[sr.req.adapter_id] += 1
            prompt += sr.req.prompt_tokens
        batch = len(finishing) + len(admitted)
        work = self.timing.step_s(batch, len(self.rows)) + self.timing.prefill_s(prompt)
        if self.timing.step_jitter:
            work *= self.rng.choice(self.timing.step_jitter)
        for sr in admitted:
            sr.finish_step = self.step_no + sr.req.output_tokens
            heapq.heappush(finishing, (sr.finish_step, sr.req.request_id, sr))
        self.step_no += 1
        if self.host is not None:  # the end depends on the other replicas' steps: known when it comes
            self.in_step, self.step_start, self.step_batch = admitted, now, batch
            self.host.start(self, work, now)
            return
        end = now + work
        self.row_s += batch * work
        for sr in admitted:
            sr.first_token_s = end
        self.schedule(end, STEP, self)

    def finish_busy(self, now: float) -> None:
        """Close the busy interval at the end of the run (for utilisation)."""
        if self.busy:
            self.busy_s += now - self.busy_since
            self.busy_since = now

    def check(self) -> None:
        """Invariants: budgets hold, every running or ready request's adapter is pinned in a slot."""
        assert len(self.slots) <= self.sizes.gpu_slots
        assert self.ram.used <= self.ram.budget and self.disk.used <= self.disk.budget
        holds: Counter[str] = Counter(self.rows)
        for sr in self.ready:
            holds[sr.req.adapter_id] += 1
        for aid in self.loading:
            if aid not in self.blocked and aid not in self.fetching:
                holds[aid] += 1
        assert len(self.writes) + (self.writing is not None) <= len(self.loading)
        for aid, n in holds.items():
            entry = self.slots.lookup(aid)
            assert entry is not None and entry.ref_count == n, (aid, n, entry)
