"""Public gateway processes (`lorafleet public-gateway`) on free ports, for tests of what several share."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

from harness.ports import free_port
from harness.processes import stop, wait_http
from tests.integration.gateway_stack import REPO


@contextlib.asynccontextmanager
async def public_gateways(env: dict[str, str], work: Path, count: int) -> AsyncIterator[list[str]]:
    """Start count gateways with env (logs in work/gateway-<i>.log); yield their URLs once each is healthy."""
    procs, urls = [], []
    try:
        for i in range(count):
            port = free_port()
            with open(work / f"gateway-{i}.log", "ab") as log:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "lorafleet.cli", "public-gateway"],
                        env={**env, "LORAFLEET_GATEWAY_PUBLIC_PORT": str(port)},
                        cwd=REPO,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
            urls.append(f"http://127.0.0.1:{port}")
        for url, proc in zip(urls, procs, strict=True):
            await wait_http(f"{url}/health", 90, proc)
        yield urls
    finally:
        for proc in procs:
            stop(proc)
