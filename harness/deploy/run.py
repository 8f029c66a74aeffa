"""Running the processes a deployment file describes: a one-shot to completion (an init container, a Job, a
preStop hook), a long-running one until its probes hold."""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path

from harness.ports import free_port
from harness.readiness import ProcessExited, wait_ready
from harness.running import Running
from harness.spec import ProcessSpec
from ops.stack.redis import ping, server_argv


class OneShotFailed(RuntimeError):
    """A one-shot process exited non-zero or outlived its time."""


def running(spec: ProcessSpec, work: Path) -> Running:
    """The process of spec with exactly spec.env as its environment, logging under work."""
    return Running(spec, dict(spec.env), work / spec.log_name())


async def run_to_end(spec: ProcessSpec, work: Path, timeout_s: float) -> Running:
    """Start the one-shot and wait for it to exit 0; raise OneShotFailed with its log's end otherwise."""
    process = running(spec, work).start()
    assert process.proc is not None
    deadline = time.monotonic() + timeout_s
    while process.proc.poll() is None:
        if time.monotonic() > deadline:
            process.kill()
            raise OneShotFailed(f"{spec.name}: still running after {timeout_s:.0f}s\n{process.tail()}")
        await asyncio.sleep(0.2)
    if process.proc.returncode != 0:
        raise OneShotFailed(f"{spec.name}: exit {process.proc.returncode}\n{process.tail()}")
    return process


# A container without a startup or readiness probe counts as started while it runs; one that exits in this
# long (a refused secret, a missing setting) failed to start.
SETTLE_S = 3.0


async def start(spec: ProcessSpec, work: Path) -> Running:
    """Start the process and wait until each of its probes holds, or (without probes) until it has run
    SETTLE_S; raise ProcessExited or TimeoutError with its log's end if not."""
    process = running(spec, work).start()
    await wait_ready(process)
    if not spec.ready:
        await asyncio.sleep(SETTLE_S)
        if not process.alive:
            raise ProcessExited(f"{spec.name} exited at start\n--- {process.log}\n{process.tail()}")
    return process


async def start_redis(
    work: Path, password: str, within_s: float = 30.0
) -> tuple[subprocess.Popen[bytes], int]:
    """A redis-server of the run's own on a free port, asking for password (the one a deployment file
    gives it), answering within within_s; the process and its port."""
    port = free_port()
    (work / "redis").mkdir()
    with open(work / "redis.log", "wb") as log:
        proc = subprocess.Popen(server_argv(port, work / "redis", password), stdout=log, stderr=log)
    deadline = time.monotonic() + within_s
    while not ping(port, password=password):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise OneShotFailed(
                f"redis-server on {port} did not answer: {(work / 'redis.log').read_text()[-2000:]}"
            )
        await asyncio.sleep(0.1)
    return proc, port
