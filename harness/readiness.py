"""Waiting for a stack's processes: each probe polled until it holds, failing at once if the process exits."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import httpx

from harness.running import Running
from harness.spec import HttpReady, Probe

POLL_S = 0.2


class ProcessExited(RuntimeError):
    """A process exited before it was ready."""


async def http_ok(url: str, headers: dict[str, str] | None = None, timeout_s: float = 1.0) -> bool:
    """One GET: True when it answers 200."""
    with contextlib.suppress(httpx.HTTPError):
        async with httpx.AsyncClient() as c:
            return (await c.get(url, headers=headers, timeout=timeout_s)).status_code == 200
    return False


async def holds(probe: Probe) -> bool:
    """One try of the probe."""
    if isinstance(probe, HttpReady):
        return await http_ok(probe.url, dict(probe.headers))
    return await probe.check()


def describe(probe: Probe) -> str:
    """The probe in a few words, for an error."""
    return f"GET {probe.url} answering 200" if isinstance(probe, HttpReady) else probe.what


async def wait_ready(process: Running, probes: tuple[Probe, ...] | None = None) -> None:
    """Until each of the process's probes (or these) holds, in order; raise with its log's tail when it
    exits first (ProcessExited) or a probe does not hold in time (TimeoutError)."""
    for probe in process.spec.ready if probes is None else probes:
        timeout_s = probe.timeout_s
        deadline = time.monotonic() + timeout_s
        while not await holds(probe):
            if process.proc is not None and process.proc.poll() is not None:
                raise ProcessExited(
                    f"{process.name} exited with {process.proc.returncode} before {describe(probe)}\n"
                    f"--- {process.log}\n{process.tail()}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{process.name}: no {describe(probe)} within {timeout_s:.0f}s\n"
                    f"--- {process.log}\n{process.tail()}"
                )
            await asyncio.sleep(POLL_S)


async def wait_for(check: Callable[[], object], timeout: float, what: str, tails: Callable[[], str]) -> None:
    """Poll a check (sync or async) until it is truthy; on timeout raise with tails()."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not within {timeout:.0f}s\n{tails()}")
        await asyncio.sleep(POLL_S)
