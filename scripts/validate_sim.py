"""Validate the fleet simulator against a real load test on the local stack, on one saved trace.

What it runs, the tolerance and the results: docs/benchmarks.md#the-simulator-against-the-load-test."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import replica_steps  # noqa: E402
from gateway.config import GatewayConfig, GatewaySettings  # noqa: E402
from loadtest.cli import run_loadtest  # noqa: E402
from loadtest.replica_metrics import parse_replicas  # noqa: E402
from loadtest.runner import LoadTestConfig  # noqa: E402
from loadtest.setup import adapter_id as setup_adapter_id  # noqa: E402
from loadtest.setup import setup  # noqa: E402
from lorafleet.profile import DEV_TOKEN  # noqa: E402
from placement_worker.config import PlacementSettings  # noqa: E402
from placement_worker.planner import Policy, wants_gpu  # noqa: E402
from replica.config import ReplicaSettings  # noqa: E402
from replica.lora.slots import SlotTable  # noqa: E402
from sim import validation  # noqa: E402
from sim.replica import CacheSizes  # noqa: E402
from sim.simulator import SimConfig, simulate  # noqa: E402
from sim.timing import TimingModel, load_timing  # noqa: E402
from sim.workload import Request, WorkloadConfig, adapter_id, generate, load, save  # noqa: E402
from stats_stream.config import StatsStreamSettings  # noqa: E402

log = logging.getLogger("validate_sim")
Start = tuple[tuple[tuple[str, ...], tuple[str, ...]], ...]
BEFORE, AFTER = "replica-steps-before.json", "replica-steps-after.json"


def args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gateway", default="http://127.0.0.1:18080")
    p.add_argument(
        "--replica", action="append", default=None, help="ID=URL (default: the local stack's two replicas)"
    )
    p.add_argument("--replica-token", default=DEV_TOKEN)
    p.add_argument("--tenant", default="loadtest")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--adapters", type=int, default=30)
    p.add_argument("--zipf", type=float, default=1.0)
    p.add_argument("--rate", type=float, default=0.5, help="requests/s (this machine's replicas are slow)")
    p.add_argument("--duration", type=float, default=300.0, help="seconds of arrivals")
    p.add_argument("--warmup", type=float, default=60.0, help="seconds of arrivals left out on both sides")
    p.add_argument("--prompt-mean", type=float, default=32.0)
    p.add_argument("--output-mean", type=float, default=16.0)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--warm", type=int, default=8, help="adapters in each replica's GPU slots at the start")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--trace-in", type=Path, default=None, help="replay this trace instead of generating")
    p.add_argument(
        "--replan-s",
        type=float,
        default=StatsStreamSettings().window_s,
        help="the stats window the placement worker re-plans on (default: the stats stream's setting)",
    )
    p.add_argument("--calibration", type=Path, action="append", default=[])
    p.add_argument(
        "--calibrate",
        action="store_true",
        help=f"measure the replicas' steps (bench/replica_steps.py) right before the run (out/{BEFORE}) and "
        f"right after it (out/{AFTER}) and simulate with both pooled (this machine's speed drifts with its "
        "other users); a run whose two calibrations differ past sim.validation's max_drift is invalid",
    )
    p.add_argument("--out", type=Path, default=Path(".data/validate"))
    p.add_argument(
        "--replay",
        type=Path,
        default=None,
        help="no real run: simulate this earlier run's served trace from its start again (with the given "
        "--calibration files) and write replay.json there",
    )
    return p.parse_args()


def known_start(
    replicas: dict[str, str],
    ids: list[str],
    warm: int,
    token: str,
    bucket_of: Callable[[str], int],
    bucket: int,
) -> tuple[tuple[tuple[str, ...], tuple[str, ...]], ...]:
    """Load the `warm` most popular adapters into every replica's slots, least popular first (so the most
    popular is the most recently used), then read what each replica holds and give the simulator the same
    start: every adapter in the trace adapters' slot bucket (other tenants' too: they take slots), those
    loaded before this run first (their order is not reported), then the warm ones; RAM as reported."""
    hot = list(reversed(ids[:warm]))

    async def warm_all() -> None:
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=120) as c:
            for rid, url in replicas.items():
                for aid in hot:
                    resp = await c.post(f"{url.rstrip('/')}/internal/replicas/{rid}/adapters/{aid}/load")
                    resp.raise_for_status()

    asyncio.run(warm_all())
    trace_ids = {aid: adapter_id(i) for i, aid in enumerate(ids)}
    start = []
    for rid, url in replicas.items():
        state = replica_state(rid, url, token)
        older = [a for a in state["gpu_adapters"] if a not in hot and bucket_of(a) == bucket]
        gpu = tuple(trace_ids.get(a, a) for a in [*older, *hot])
        start.append((gpu, tuple(trace_ids.get(a, a) for a in state["ram_adapters"])))
    return tuple(start)


def registered_rank(config: GatewayConfig) -> Callable[[str], int]:
    """adapter id -> its registered rank (the internal API), cached."""
    token = config.gateway.service_token.get_secret_value()
    client = httpx.Client(
        base_url=config.gateway.internal_base_url(), headers={"Authorization": f"Bearer {token}"}, timeout=30
    )
    cache: dict[str, int] = {}

    def rank(adapter: str) -> int:
        if adapter not in cache:
            resp = client.get(f"/internal/adapters/{adapter}")
            cache[adapter] = int(resp.json()["rank"]) if resp.status_code == 200 else -1
        return cache[adapter]

    return rank


def replica_state(rid: str, url: str, token: str) -> dict:
    resp = httpx.get(
        f"{url.rstrip('/')}/internal/replicas/{rid}/state", headers={"Authorization": f"Bearer {token}"}
    )
    resp.raise_for_status()
    return resp.json()


def real_run(a: argparse.Namespace, replicas: dict[str, str]) -> Start:
    """Set up, calibrate (--calibrate), warm, replay the trace through the gateway; save what it served."""
    aliases, keys = setup(a.adapters + 1, a.tenant, a.rank)
    ids = [setup_adapter_id(a.tenant, a.rank, i) for i in range(a.adapters)]
    calibration_id = setup_adapter_id(a.tenant, a.rank, a.adapters)
    workload = WorkloadConfig(
        adapters=a.adapters,
        rate=a.rate,
        zipf_s=a.zipf,
        duration_s=a.duration,
        prompt_mean=a.prompt_mean,
        output_mean=a.output_mean,
        seed=a.seed,
    )
    trace = load(a.trace_in) if a.trace_in else generate(workload)
    save(trace, a.out / "trace.jsonl")
    # its own adapter, outside the trace: the calibration unloads it from all but one replica
    steps = argparse.Namespace(
        replica=[f"{rid}={url}" for rid, url in replicas.items()],
        token=a.replica_token,
        adapter=[calibration_id, *ids[:7]],
        batches=[1, 2, 3, 4, 8],
        tokens=16,
        repeats=2,
        prompt_words=[8, 32, 96, 192],
        gateway=a.gateway,
        model=aliases[a.adapters],
        key=keys[a.tenant],
    )
    if a.calibrate:
        calibrate(steps, a.out / BEFORE)
    table = SlotTable(ReplicaSettings().lora_slots)
    rank_of = registered_rank(GatewayConfig.from_env())

    def bucket_of(adapter: str) -> int:
        r = rank_of(adapter)
        return table.bucket_for_rank(r) if r > 0 else -1

    start = known_start(replicas, ids, a.warm, a.replica_token, bucket_of, table.bucket_for_rank(a.rank))
    (a.out / "start.json").write_text(json.dumps(dict(zip(replicas, start, strict=True)), indent=1) + "\n")
    cfg = LoadTestConfig(a.gateway, tuple(aliases[: a.adapters]), keys, workload, temperature=a.temperature)
    log.info("real run: %d requests over %.0f s", len(trace), max(r.arrival_s for r in trace))
    run_loadtest(cfg, [], a.out / "real", progress=True, replicas=replicas, trace=trace)
    records = [json.loads(line) for line in (a.out / "real" / "requests.jsonl").read_text().splitlines()]
    save(validation.realized(trace, records), a.out / "trace-served.jsonl")
    if a.calibrate:
        calibrate(steps, a.out / AFTER)
        a.calibration = [a.out / BEFORE, a.out / AFTER, *a.calibration]
    return start


def calibrate(steps: argparse.Namespace, path: Path) -> None:
    log.info("calibrating: bench/replica_steps.py -> %s", path)
    path.write_text(json.dumps(asyncio.run(replica_steps.run(steps)), indent=2) + "\n")


def window_peak(trace: list[Request], window_s: float) -> float:
    """The most output tokens/s any adapter had in one window (windows from 0): the placement worker's GPU
    rule and owner counts only act on an adapter past its thresholds."""
    tokens: dict[tuple[str, int], int] = {}
    for r in trace:
        key = (r.adapter_id, int(r.arrival_s // window_s))
        tokens[key] = tokens.get(key, 0) + r.output_tokens
    return max(tokens.values(), default=0) / window_s


def headline(side: dict) -> dict:
    return {k: side[k] for k in ("ttft_p50_s", "ttft_p95_s", "gpu_hit_rate")}


def compare(a: argparse.Namespace, run: Path, replicas: list[str], start: Start) -> dict:
    """Simulate the run's served trace on the local fleet from its start; both sides and the verdict."""
    rs, gs = ReplicaSettings(), GatewaySettings()
    bucket = SlotTable(rs.lora_slots).bucket_for_rank(a.rank)
    weights = REPO / ".data" / "loadtest" / "adapters" / setup_adapter_id(a.tenant, a.rank, 0)
    sizes = CacheSizes(
        gpu_slots=rs.lora_slots[bucket],
        rank=bucket,
        adapter_bytes=(weights / "adapter_model.safetensors").stat().st_size,
        ram_bytes=rs.ram_budget_bytes,
        disk_bytes=rs.disk_budget_bytes,
    )
    ps = PlacementSettings()
    steps = [p for p in a.calibration if "runs" in json.loads(p.read_text())]  # bench/replica_steps.py files
    others = [p for p in a.calibration if p not in steps]
    pair = [run / BEFORE, run / AFTER]
    drift = None
    if pair == steps:
        drift = validation.drift(*(json.loads(p.read_text()) for p in pair))
    records = [json.loads(line) for line in (run / "real" / "requests.jsonl").read_text().splitlines()]
    served = load(run / "trace-served.jsonl")

    def sim_with(calibration: list[Path]) -> tuple[dict, SimConfig, TimingModel]:
        timing = replace(load_timing(calibration), max_batch=rs.max_num_seqs)
        contention = validation.pooled_contention(
            json.loads(p.read_text()).get("host_contention") for p in calibration
        )
        sim_cfg = SimConfig(
            replicas=len(replicas),
            routing=gs.routing_mode,
            owners_k=gs.owners_k,
            spill_wait_s=gs.spill_wait_s,
            prefill_tokens_per_s=gs.prefill_tokens_per_s,
            row_wait_s=gs.row_wait_s,
            sizes=sizes,
            warmup_s=a.warmup,
            seed=a.seed,
            replan_s=a.replan_s,
            demand_ttl_s=ps.demand_ttl_s,
            gpu_tokens_per_s=ps.gpu_tokens_per_s,
            gpu_slot_fraction=ps.gpu_slot_fraction,
            initial=start,
            host_contention=contention,
        )
        return validation.sim_side(simulate(sim_cfg, timing, served).requests, a.warmup), sim_cfg, timing

    sim, sim_cfg, timing = sim_with(a.calibration)
    real = validation.real_side(records, a.warmup)
    alone = {}
    if drift is not None:  # each calibration alone, for the record (the verdict uses the pool)
        alone = {
            name: headline(sim_with([p, *others])[0])
            for name, p in zip(("before", "after"), pair, strict=True)
        }
    peak = window_peak(served, a.replan_s)
    return {
        "command": " ".join(sys.argv),
        "trace": {"requests": len(served), "file": str(run / "trace.jsonl")},
        "start": {rid: {"gpu": list(g), "ram": len(r)} for rid, (g, r) in zip(replicas, start, strict=True)},
        "fleet": {
            "replicas": replicas,
            "sizes": asdict(sizes),
            "timing": asdict(timing),
            "host_contention": sim_cfg.host_contention,
            "calibration": [str(p) for p in a.calibration],
        },
        "placement": {  # the placement worker's settings, as the running worker reads them
            "replan_s": a.replan_s,
            "demand_ttl_s": sim_cfg.demand_ttl_s,
            "gpu_tokens_per_s": sim_cfg.gpu_tokens_per_s,
            "gpu_slot_fraction": sim_cfg.gpu_slot_fraction,
            "replica_capacity_tokens_per_s": ps.replica_capacity_tokens_per_s,
            "sim_replica_capacity_tokens_per_s": round(timing.decode_tokens_per_s(), 2),
            "replica_reported_gpu_slots": sum(rs.lora_slots.values()),
            "sim_gpu_slots": sizes.gpu_slots,
            "peak_adapter_window_tokens_per_s": round(peak, 3),
            "gpu_rule_acts": wants_gpu(peak, Policy(gpu_tokens_per_s=sim_cfg.gpu_tokens_per_s)),
        },
        "calibration_drift": drift,
        "real": real,
        "sim": sim,
        "sim_by_calibration": alone,
        "verdict": validation.verdict(
            real, sim, validation.Tolerance(), None if drift is None else drift["after_over_before"]
        ),
    }


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    a = args()
    if a.replay is not None:  # simulate a recorded run again (another calibration, a changed model)
        recorded = json.loads((a.replay / "start.json").read_text())
        if (a.replay / BEFORE).exists() and (a.replay / AFTER).exists():
            a.calibration = [a.replay / BEFORE, a.replay / AFTER, *a.calibration]
        start = tuple((tuple(g), tuple(r)) for g, r in recorded.values())
        out = compare(a, a.replay, list(recorded), start)
        name = "replay.json"
        target = a.replay
    else:
        a.out.mkdir(parents=True, exist_ok=True)
        replicas = parse_replicas(
            a.replica or ["replica-0=http://127.0.0.1:18100", "replica-1=http://127.0.0.1:18101"]
        )
        start = real_run(a, replicas)
        out = compare(a, a.out, list(replicas), start)
        name, target = "validation.json", a.out
    (target / name).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
