"""The child processes of a bench or test stack: wait until one answers over HTTP, stop one by its pid."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import time

import httpx


async def wait_http(
    url: str, timeout: float, proc: subprocess.Popen | None = None, headers: dict[str, str] | None = None
) -> None:
    """Poll url (sending headers) until it answers 200; fail at once if proc (its server) has exited."""
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient() as c:
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"{url}: process exited with {proc.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                if (await c.get(url, headers=headers, timeout=1)).status_code == 200:
                    return
            await asyncio.sleep(0.2)
    raise TimeoutError(f"{url} did not answer 200 within {timeout}s")


def stop(proc: subprocess.Popen | None, grace_s: float = 10.0, sig: signal.Signals = signal.SIGTERM) -> None:
    """sig (SIGTERM), then SIGKILL if the process is still there after grace_s."""
    if proc is not None and proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
