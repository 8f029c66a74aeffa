"""`python -m bench.stack_memory`: the idle local stack's resident memory, process by process, as JSON.

A private copy of the local stack's processes on free ports (harness/stacks/scaleup.py: its own database,
data folder, replica ids and consumer groups, so the shared stack is never touched), with the local
profile's replica sizing: replica 0, the autoscaler and the replica it starts at once, the public and
internal gateways, the registry validator, the relay, the placement worker, the stats stream and
Prometheus. One streamed chat goes through the public gateway (so each replica's weights are paged in
as in a demo), then the stack idles `settle_s` and every process's RSS (with its children) is read from
/proc. The backing services are the shared PostgreSQL, Kafka and object store: their RSS is added as
measured from their pid files.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from harness.ports import free_port
from harness.spec import ProcessSpec, app_args
from harness.stacks.scaleup import ADAPTERS, ScaleupConfig, scaleup_stack, wait_for
from lorafleet.config import PlatformSettings, get_settings
from ops.stack import prometheus
from ops.stack.memory import rss_bytes, tree_rss_bytes
from ops.stack.profile import LOCAL_REPLICA_ENV
from ops.stack.scrape import LISTENERS
from ops.stack.stack import INFRA

MIB = 1 << 20


async def _chat(gateway_url: str, key: str) -> int:
    body = {
        "model": next(iter(ADAPTERS.values())),
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 16,
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=gateway_url, headers=headers, timeout=120) as c:
        async with c.stream("POST", "/v1/chat/completions", json=body) as resp:
            chunks = sum([line.startswith("data: {") async for line in resp.aiter_lines()])
            return resp.status_code if chunks else -1


async def measure(platform: PlatformSettings, work: Path, settle_s: float = 20.0) -> dict[str, Any]:
    ports = {
        listener.port_env: str(free_port()) for listener in LISTENERS if "PUBLIC" not in listener.port_env
    }
    env = {
        **LOCAL_REPLICA_ENV,
        **ports,
        "LORAFLEET_GATEWAY_VALIDATOR_GROUP": f"registry-validator-{work.name}",
    }
    cfg = ScaleupConfig(unmanaged=1, max_replicas=2, stats_min_replicas=2, cooldown_s=2.0, env=env)
    async with scaleup_stack(platform, work, cfg) as stack:
        # the scale-up stack names its public gateway "gateway"
        for name, command in (("registry-validator", "registry-validator"), ("internal-gateway", "gateway")):
            stack.add(ProcessSpec(name, app_args(command))).start()
        stack.autoscaler().start()
        prom = stack.platform.model_copy(update={"prometheus_port": free_port()})
        processes = [listener.process for listener in LISTENERS]
        await asyncio.to_thread(prometheus.up, prom, 60.0, stack.env, processes)
        try:

            async def second_ready() -> bool:
                state = await stack.state(1)
                return state is not None and state.status == "ready"

            await wait_for(second_ready, 300, "the autoscaler's replica ready", stack)
            status = await _chat(stack.gateway_url, stack.key)
            await asyncio.sleep(settle_s)
            rss: dict[str, int | None] = {}
            for name, proc in stack.procs.items():
                # the autoscaler's replicas are its children: counted below, once
                own = rss_bytes if name == "autoscaler" else tree_rss_bytes
                rss[name] = own(proc.proc.pid) if proc.proc is not None else None
            for r in stack.records().live():
                rss[r.replica_id] = tree_rss_bytes(r.pid)
            rss["prometheus"] = tree_rss_bytes(prometheus.process(prom).pid() or -1)
            shared = get_settings()
            for svc in INFRA:
                pid = svc.pid(shared)
                if svc.name != "prometheus" and pid is not None:
                    rss[svc.name] = tree_rss_bytes(pid)
        finally:
            prometheus.down(prom)
    mib = {name: round(v / MIB) if v is not None else None for name, v in rss.items()}
    total = sum(v for v in rss.values() if v is not None)
    replicas = sum(
        v for k, v in rss.items() if v is not None and (k == "replica-0" or k.startswith(stack.prefix))
    )
    return {
        "chat_status": status,
        "settle_s": settle_s,
        "rss_mib": mib,
        "replicas_mib": round(replicas / MIB),
        "total_mib": round(total / MIB),
        "profile": LOCAL_REPLICA_ENV,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="stack-memory-") as tmp:
        result = asyncio.run(measure(get_settings(), Path(tmp)))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
