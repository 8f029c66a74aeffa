"""Discrete-event fleet simulation: the real router (gateway.public.routing.policy) picks a replica from live
loads, the real placement (placement_worker.planner over schemas.rendezvous) decides owners, and each
replica's cache is the real SlotTable / ByteLru bookkeeping (sim.replica), timed by sim.timing.

Placement is either fixed before the run from the whole trace's demand (replan_s = 0: a placement worker
that already knows the traffic), or re-planned every replan_s from the traffic observed so far, as the real
placement worker does from the stats stream's windows: each adapter's demand is the output tokens/s of its
latest window (requests completed in it), forgotten after demand_ttl_s; the changes (planner.diff) go to
the replicas as load/unload commands.
"""

from __future__ import annotations

import heapq
import random
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

from gateway.public.routing.merged_first import merged_first
from gateway.public.routing.policy import ROUTING_MODES, ReplicaLoad, RouterPolicy
from placement_worker.planner import Placements, Policy, desired, diff, prewarm_targets
from sim.host import SharedHost
from sim.probe import FleetProbe
from sim.replica import FETCHED, LOAD_DONE, STEP, Batch, CacheSizes, SimReplica, SimRequest
from sim.timing import TimingModel
from sim.workload import Request

ARRIVE = 0
REPLAN = 4
REACH = 5  # a routed request reaches its replica's queue (after timing.admit_s)


@dataclass(frozen=True)
class SimConfig:
    replicas: int = 26
    routing: str = "cost"  # a key of gateway.public.routing.policy.ROUTING_MODES (the gateway's default)
    owners_k: int = 2
    report_interval_s: float = 1.0  # replicas publish their resident adapters this often
    sizes: CacheSizes = field(default_factory=CacheSizes)
    warmup_s: float = 60.0  # requests arriving earlier are simulated but not reported
    seed: int = 0
    check_every: int = 0  # run the replicas' invariant checks every N events (tests); 0 = never
    replan_s: float = 0.0  # 0: placement fixed from the whole trace's demand; else re-plan this often
    demand_ttl_s: float = 300.0  # the placement worker's LORAFLEET_PLACEMENT_DEMAND_TTL_S
    # the placement worker's LORAFLEET_PLACEMENT_GPU_TOKENS_PER_S and _GPU_SLOT_FRACTION (planner.py)
    gpu_tokens_per_s: float = Policy.gpu_tokens_per_s
    gpu_slot_fraction: float = Policy.gpu_slot_fraction
    # every replica on one machine's compute (the local CPU stack): how much two steps at once slow each
    # other (sim.host; 1 = even sharing); None: a device per replica, as on a GPU fleet
    host_contention: float | None = None
    # per replica (in order): (GPU adapters, least recently used first; RAM adapters) at the start
    initial: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = ()
    # the replicas' ids, which decide each adapter's owners (rendezvous); default replica-000, -001, ...
    replica_ids: tuple[str, ...] = ()
    probe_window_s: float = 60.0  # sim.probe's window for active sets and GPU copies
    # the cost router's prices (the gateway's LORAFLEET_GATEWAY_DRAIN_TOKENS_PER_S and _SLOT_COST_S)
    drain_tokens_per_s: float = RouterPolicy.drain_tokens_per_s
    slot_cost_s: float = RouterPolicy.slot_cost_s
    # when an owner is overloaded (the gateway's LORAFLEET_GATEWAY_SPILL_WAIT_S, _PREFILL_TOKENS_PER_S and
    # _ROW_WAIT_S: what the gateway believes, which the timing model need not match)
    spill_wait_s: float = RouterPolicy.spill_wait_s
    prefill_tokens_per_s: float = RouterPolicy.prefill_tokens_per_s
    row_wait_s: float = RouterPolicy.row_wait_s


@dataclass
class SimResult:
    config: SimConfig
    timing: TimingModel
    requests: list[SimRequest]
    replicas: list[SimReplica]
    duration_s: float
    owners_per_adapter: dict[str, int]
    probe: FleetProbe


def demand_from_trace(trace: list[Request], duration_s: float) -> dict[str, float]:
    """adapter -> output tokens/s over the trace: what the placement worker learns from stats."""
    tokens: dict[str, float] = defaultdict(float)
    for r in trace:
        tokens[r.adapter_id] += r.output_tokens
    return {a: t / duration_s for a, t in tokens.items()}


class Simulation:
    """Run one trace through one fleet configuration."""

    def __init__(self, cfg: SimConfig, timing: TimingModel, trace: list[Request]) -> None:
        self.cfg, self.timing, self.trace = cfg, timing, trace
        # the gateway's own wrapper: a fleet without merged replicas leaves the mode's plan as it is
        self.route = merged_first(ROUTING_MODES[cfg.routing])
        # the gateway's token threshold is not set: it judges only a replica that reports no batch, and every
        # simulated replica reports one
        self.policy = RouterPolicy(
            cfg.owners_k,
            drain_tokens_per_s=cfg.drain_tokens_per_s,
            slot_cost_s=cfg.slot_cost_s,
            load_s=dict(timing.load_s),
            spill_wait_s=cfg.spill_wait_s,
            prefill_tokens_per_s=cfg.prefill_tokens_per_s,
            row_wait_s=cfg.row_wait_s,
        )
        self.rng = random.Random(cfg.seed)
        self.events: list[tuple[float, int, int, object]] = []
        self.seq = 0
        self.done: list[SimRequest] = []
        ids = list(cfg.replica_ids) or [f"replica-{i:03d}" for i in range(cfg.replicas)]
        if len(ids) != cfg.replicas or len(set(ids)) != len(ids):
            raise ValueError(f"replica_ids must be {cfg.replicas} distinct ids")
        self.replicas = {
            rid: SimReplica(rid, timing, cfg.sizes, self._schedule, self._complete, cfg.seed) for rid in ids
        }
        if cfg.host_contention is not None:
            host = SharedHost(self._schedule, STEP, cfg.host_contention)
            for replica in self.replicas.values():
                replica.host = host
        self.inflight: dict[str, int] = dict.fromkeys(ids, 0)  # the gateway's reserved tokens per replica
        # each replica's batch at its last report (running, waiting, prompt tokens not yet prefilled), and
        # the requests and prompt tokens routed to it since: what a gateway knows of it
        self.batch: dict[str, Batch] = dict.fromkeys(ids, Batch(0, 0, 0))
        self.since: dict[str, tuple[int, int]] = dict.fromkeys(ids, (0, 0))
        self.views: dict[str, ReplicaLoad] = {}
        self.dirty: set[str] = set(ids)
        self.resident: dict[str, tuple[frozenset[str], frozenset[str]]] = {}
        self.published: dict[str, int] = {}  # replica -> cache_version of its last report
        self.owners_per_adapter: dict[str, int] = {}
        self.policy_place = Policy(
            cfg.owners_k, timing.decode_tokens_per_s(), cfg.gpu_tokens_per_s, cfg.gpu_slot_fraction
        )
        self.gpu_slots = dict.fromkeys(ids, cfg.sizes.gpu_slots)  # what each replica.state reports
        self.placements: Placements = {}
        self.window_tokens: dict[str, int] = defaultdict(int)  # output tokens completed this window
        self.demand: dict[str, float] = {}  # adapter -> tokens/s of its latest window with traffic
        self.latest: dict[str, float] = {}  # adapter -> end of that window
        self.replans = 0
        self.probe = FleetProbe(self.replicas, cfg.probe_window_s, cfg.warmup_s)

    def _schedule(self, t: float, kind: int, payload: object) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, payload))

    def _complete(self, sr: SimRequest) -> None:
        self.inflight[sr.replica_id] -= sr.req.prompt_tokens + sr.req.output_tokens
        self.dirty.add(sr.replica_id)
        self.done.append(sr)
        self.window_tokens[sr.req.adapter_id] += sr.req.output_tokens

    def place(self, duration_s: float) -> None:
        """Owners from the real planner (counts raised with traffic) hold it in RAM; gpu placements in GPU.

        With re-planning the run starts from no traffic knowledge, as a fleet that has just registered its
        adapters: every adapter at its default owners, in RAM, and in its home's GPU slot where the alias's
        prewarm put it (placement_worker.planner.prewarm_targets), unless the config gives the caches to
        start from. Otherwise it starts from the whole trace's demand, as a fleet that has served
        this traffic for a while: after the planner's gpu placements, LRU has filled the other free slots
        with the owners' adapters, the hottest the most recently used, each adapter's home (its first
        owner) before its other owners."""
        for replica, (gpu, ram) in zip(self.replicas.values(), self.cfg.initial, strict=False):
            replica.start_with(list(gpu), list(ram))
        demand = demand_from_trace(self.trace, duration_s)
        if self.cfg.replan_s > 0:
            demand = dict.fromkeys(demand, 0.0)
        plan = desired(demand, list(self.replicas), self.policy_place, gpu_slots=self.gpu_slots)
        self.placements = plan
        hottest = sorted(plan, key=lambda a: -demand[a])
        for i, adapter_id in enumerate(hottest):
            self.owners_per_adapter[adapter_id] = len(plan[adapter_id])
            for replica_id, tier in plan[adapter_id].items():
                replica = self.replicas[replica_id]
                replica.own(adapter_id)
                if tier == "gpu":
                    replica.prewarm(adapter_id, -i * 1e-6)
        if self.cfg.replan_s > 0:
            if not self.cfg.initial:
                self._prewarm_homes(plan)
            return
        for first in (True, False):  # the homes (first owners) first, then the other owners' free slots
            for i, adapter_id in enumerate(hottest):
                if demand[adapter_id] > 0:
                    for n, replica_id in enumerate(plan[adapter_id]):
                        if (n == 0) == first:
                            self.replicas[replica_id].prewarm(adapter_id, -i * 1e-6)

    def _prewarm_homes(self, plan: Placements) -> None:
        """Registration's prewarms, in adapter id order: each adapter into its home's slot, a replica with
        more homes than slots keeping the last ones, as its LRU does."""
        homes: dict[str, list[str]] = defaultdict(list)
        for adapter_id in sorted(plan):
            for replica_id in prewarm_targets(adapter_id, list(plan[adapter_id]), takes_over=False):
                homes[replica_id].append(adapter_id)
        for replica_id, adapter_ids in homes.items():
            replica = self.replicas[replica_id]
            for i, adapter_id in enumerate(adapter_ids[-replica.sizes.gpu_slots :]):
                replica.prewarm(adapter_id, -1.0 + i * 1e-6)

    def replan(self, now: float) -> None:
        """Close the traffic window and re-plan with the real planner, as the worker does: every adapter
        with a fresh window (its latest window's tokens/s, forgotten after demand_ttl_s), and the ones
        whose window just passed the TTL at 0; send the changes to the replicas."""
        window = {a: tokens / self.cfg.replan_s for a, tokens in self.window_tokens.items() if tokens}
        self.window_tokens.clear()
        self.demand.update(window)
        self.latest.update(dict.fromkeys(window, now))
        expired = [a for a, end in self.latest.items() if now - end >= self.cfg.demand_ttl_s]
        for adapter_id in expired:
            del self.latest[adapter_id], self.demand[adapter_id]
        demand = {**self.demand, **dict.fromkeys(expired, 0.0)}
        target = desired(
            demand, list(self.replicas), self.policy_place, gpu_slots=self.gpu_slots, current=self.placements
        )
        for change in diff({a: self.placements.get(a, {}) for a in target}, target):
            self.replicas[change.replica_id].command(change.adapter_id, change.command, change.tier, now)
        self.placements.update(target)
        for adapter_id, owners_ in target.items():
            self.owners_per_adapter[adapter_id] = max(
                self.owners_per_adapter.get(adapter_id, 0), len(owners_)
            )
        self.replans += 1

    def _publish(self) -> None:
        """Every replica's state report: its resident adapters and its batch (tokens in flight come from
        the gateway's own count)."""
        for rid, replica in self.replicas.items():
            changed = self.published.get(rid) != replica.cache_version
            if changed:
                self.resident[rid] = replica.state()
                self.published[rid] = replica.cache_version
            batch = replica.batch()
            if changed or batch != self.batch[rid] or self.since[rid] != (0, 0):
                self.batch[rid], self.since[rid] = batch, (0, 0)
                self.dirty.add(rid)

    def _live(self) -> list[ReplicaLoad]:
        max_running = self.timing.max_batch
        for rid in sorted(self.dirty):  # views in id order: random routing draws alike in every process
            resident, gpu = self.resident[rid]
            running, waiting, prefill = self.batch[rid]
            sent, prompts = self.since[rid]
            self.views[rid] = ReplicaLoad(
                rid,
                "",
                self.inflight[rid],
                resident,
                gpu,
                gpu_slots=self.gpu_slots[rid],
                running=running,
                waiting=waiting + sent,
                max_running=max_running,
                prefill_tokens=prefill + prompts,
            )
        self.dirty.clear()
        return list(self.views.values())

    def run(self, on_progress: Callable[[float], None] | None = None) -> SimResult:
        duration = max((r.arrival_s for r in self.trace), default=0.0)
        self.place(max(duration, 1e-9))
        for r in self.trace:
            self._schedule(r.arrival_s, ARRIVE, SimRequest(r))
        if self.cfg.replan_s > 0:
            self._schedule(self.cfg.replan_s, REPLAN, None)
        next_report, n = 0.0, 0
        events, replicas = self.events, list(self.replicas.values())
        now = 0.0
        while events:
            now, _, kind, payload = heapq.heappop(events)
            if now >= next_report:
                self._publish()
                next_report = now + self.cfg.report_interval_s
                self.probe.tick(now)
                if on_progress is not None:
                    on_progress(now)
            # Each kind has one payload type, fixed where it is scheduled; the casts name it.
            if kind == STEP:
                if isinstance(payload, tuple):  # a step end timed by the shared host
                    replica, version = cast(tuple[SimReplica, float], payload)
                    assert replica.host is not None  # only a shared host times steps this way
                    if replica.host.end(replica, version, now):
                        replica.step(now)
                else:
                    cast(SimReplica, payload).step(now)
            elif kind == ARRIVE:
                self._arrive(cast(SimRequest, payload), now)
            elif kind == LOAD_DONE:
                replica, aid = cast(tuple[SimReplica, str], payload)
                replica.load_done(aid, now)
            elif kind == FETCHED:
                replica, aid = cast(tuple[SimReplica, str], payload)
                replica.fetched(aid, now)
            elif kind == REACH:
                replica, sr = cast(tuple[SimReplica, SimRequest], payload)
                replica.arrive(sr, now)
            elif kind == REPLAN:
                self.replan(now)
                if now + self.cfg.replan_s <= duration:
                    self._schedule(now + self.cfg.replan_s, REPLAN, None)
            n += 1
            if self.cfg.check_every and n % self.cfg.check_every == 0:
                for replica in replicas:
                    replica.check()
        for replica in replicas:
            replica.finish_busy(now)
        return SimResult(self.cfg, self.timing, self.done, replicas, now, self.owners_per_adapter, self.probe)

    def _arrive(self, sr: SimRequest, now: float) -> None:
        plan = self.route(sr.req.adapter_id, self._live(), self.policy, self.rng)
        target = plan.replicas[0].replica_id
        sr.route_reason = plan.reason
        self.probe.on_route(sr, target)
        self.inflight[target] += sr.req.prompt_tokens + sr.req.output_tokens
        sent, prompts = self.since[target]
        self.since[target] = (sent + 1, prompts + sr.req.prompt_tokens)
        self.dirty.add(target)
        if self.timing.admit_s > 0:
            self._schedule(now + self.timing.admit_s, REACH, (self.replicas[target], sr))
        else:
            self.replicas[target].arrive(sr, now)


def simulate(cfg: SimConfig, timing: TimingModel, trace: list[Request]) -> SimResult:
    return Simulation(cfg, timing, trace).run()
