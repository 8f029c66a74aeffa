"""The fault soak's faults, each on a process this run started: begin it, wait its down time, end it.

- relay, registry-validator, placement-worker: SIGKILL; `lorafleet services supervise` starts it again;
- replica: SIGKILL a replica (chosen by the seed), start it again after down_s;
- kafka: SIGKILL the broker, start it again after down_s (ops.stack.kafka.up);
- postgres: `pg_ctl stop -m immediate` (no checkpoint, as in a crash), start it again after down_s.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Awaitable, Callable

from bench.soak.schedule import Fault
from bench.soak.stack import SoakStack
from harness.stacks import outage as ostack
from lorafleet.pids import pid_alive
from ops.stack import kafka, postgres

GONE_WITHIN_S = 15.0


async def _gone(pid: int, what: str) -> None:
    deadline = time.monotonic() + GONE_WITHIN_S
    while pid_alive(pid):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} (pid {pid}) still alive {GONE_WITHIN_S}s after SIGKILL")
        await asyncio.sleep(0.05)


async def _supervised(stack: SoakStack, fault: Fault, _pick: int) -> None:
    pid = stack.infra.app_pids()[fault.kind]
    if pid is None:
        raise RuntimeError(f"{fault.kind} is not running: nothing to kill")
    os.kill(pid, signal.SIGKILL)
    await _gone(pid, fault.kind)


async def _replica(stack: SoakStack, fault: Fault, pick: int) -> None:
    names = sorted(stack.replicas)
    victim = stack.replicas[names[pick % len(names)]]
    await asyncio.to_thread(victim.kill)
    await asyncio.sleep(fault.down_s)
    victim.start()


async def _kafka(stack: SoakStack, fault: Fault, _pick: int) -> None:
    await asyncio.to_thread(ostack.kill_broker, stack.settings, GONE_WITHIN_S)
    await asyncio.sleep(fault.down_s)
    await asyncio.to_thread(kafka.up, stack.settings)


async def _postgres(stack: SoakStack, fault: Fault, _pick: int) -> None:
    await asyncio.to_thread(postgres.down, stack.settings, "immediate")
    await asyncio.sleep(fault.down_s)
    await asyncio.to_thread(postgres.up, stack.settings)


INJECT: dict[str, Callable[[SoakStack, Fault, int], Awaitable[None]]] = {
    "relay": _supervised,
    "registry-validator": _supervised,
    "placement-worker": _supervised,
    "replica": _replica,
    "kafka": _kafka,
    "postgres": _postgres,
}


async def inject(stack: SoakStack, fault: Fault, pick: int) -> None:
    """Begin the fault, keep it for its down time, end it (pick chooses the replica)."""
    await INJECT[fault.kind](stack, fault, pick)
